package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/customers"
	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/outbound"
	"billing/internal/stripeclient"
)

// Charge statuses of a completed row besides Stripe's own PaymentIntent statuses (succeeded,
// processing, requires_capture, requires_action).
const (
	chargeDeclined = "declined" // a card error: the answer is a 402 card_declined
	chargeFailed   = "failed"   // any other final refusal by Stripe: 422 charge_failed
)

// ChargeKey is the Stripe idempotency key of an order's charge.
func ChargeKey(orderID string) string { return outbound.Key("charge", orderID) }

type chargeRequestJSON struct {
	OrderID     json.RawMessage `json:"order_id"`
	UserID      json.RawMessage `json:"user_id"`
	Amount      json.RawMessage `json:"amount"`
	Currency    json.RawMessage `json:"currency"`
	Description json.RawMessage `json:"description"`
}

// chargeRequest is a validated POST /v1/charges body; its JSON encoding (fixed field order) is
// what request_hash hashes.
type chargeRequest struct {
	OrderID     string  `json:"order_id"`
	UserID      string  `json:"user_id"`
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Description *string `json:"description"`
}

// chargeBody is the success answer of POST /v1/charges.
type chargeBody struct {
	OrderID         string `json:"order_id"`
	Status          string `json:"status"`
	PaymentIntentID string `json:"payment_intent_id"`
	Amount          int64  `json:"amount"`
	Currency        string `json:"currency"`
	IdempotencyKey  string `json:"idempotency_key"`
}

// chargeRow is a row of the charges table, scanned by column name.
type chargeRow struct {
	OrderID          string
	UserID           string
	StripeCustomerID string
	Amount           int64
	Currency         string
	Description      *string
	RequestHash      string
	IdempotencyKey   string
	Livemode         bool
	State            string
	Status           *string
	PaymentIntentID  *string
	PaymentMethodID  *string
	Answer           *string
	Attempts         int
	// AmountRefunded is Stripe's, from the charge's events: refunds made elsewhere count too.
	AmountRefunded *int64
	CreatedAt      time.Time
}

func parseChargeRequest(c echo.Context) (chargeRequest, error) {
	var raw chargeRequestJSON
	if err := httpserver.DecodeJSON(c, &raw, false); err != nil {
		return chargeRequest{}, err
	}
	var (
		req chargeRequest
		err error
		ok  bool
	)
	if req.OrderID, err = idField(raw.OrderID, "order_id", apierr.CodeInvalidOrderID); err != nil {
		return req, err
	}
	if req.UserID, err = idField(raw.UserID, "user_id", apierr.CodeInvalidUserID); err != nil {
		return req, err
	}
	if req.Amount, ok, err = amountField(raw.Amount); err != nil {
		return req, err
	} else if !ok {
		return req, apierr.New(apierr.CodeInvalidAmount, "amount is required")
	}
	if req.Currency, err = currencyField(raw.Currency); err != nil {
		return req, err
	}
	if req.Description, err = descriptionField(raw.Description); err != nil {
		return req, err
	}
	return req, nil
}

func (s *Service) postCharge(c echo.Context) error {
	req, err := parseChargeRequest(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), callTimeout)
	defer cancel()
	return countOutcome("charge", s.charge(ctx, req)).Write(c)
}

// charge runs the ledger path of the package doc for one order.
func (s *Service) charge(ctx context.Context, req chargeRequest) reply {
	hash := requestHash(req)
	row, found, err := s.loadCharge(ctx, s.db, req.OrderID)
	if err != nil {
		return reply{Err: err}
	}
	if !found {
		cust, err := customers.Get(ctx, s.db, req.UserID, s.livemode)
		if errors.Is(err, customers.ErrNotFound) {
			return reply{Err: apierr.New(apierr.CodeNoCustomer, "user %s has no Stripe customer; PUT /v1/customers/%s first", req.UserID, req.UserID)}
		}
		if err != nil {
			return reply{Err: database.APIError(err, "load customer")}
		}
		if err := s.insertCharge(ctx, req, hash, cust.StripeID()); err != nil {
			return reply{Err: err}
		}
		// Read back what is there: ours, or a concurrent request's row (which may conflict).
		if row, found, err = s.loadCharge(ctx, s.db, req.OrderID); err != nil {
			return reply{Err: err}
		} else if !found {
			return reply{Err: apierr.Internal(fmt.Errorf("charge row of order %q vanished after insert", req.OrderID))}
		}
	}
	if row.Livemode != s.livemode {
		return reply{Err: modeConflict("order "+req.OrderID, row.Livemode)}
	}
	if row.RequestHash != hash {
		return reply{Err: chargeConflict(row, req)}
	}
	if row.State == stateCompleted {
		return answerOf(row.Answer, &chargeBody{}, false)
	}
	if row.PaymentMethodID == nil {
		if err := s.resolvePaymentMethod(ctx, row); err != nil {
			return reply{Err: err}
		}
	}
	return s.finishCharge(ctx, req.OrderID)
}

func (s *Service) loadCharge(ctx context.Context, db *gorm.DB, orderID string) (*chargeRow, bool, error) {
	var row chargeRow
	// An order id is the app's, one per database: a row of the other mode (another deployment
	// on this database) is found, to be refused as a conflict, not charged again in this one.
	res := db.WithContext(ctx).Raw(`/* all modes: refused below when of the other */ SELECT * FROM charges WHERE order_id = $1`, orderID).Scan(&row)
	if res.Error != nil {
		return nil, false, database.APIError(res.Error, "load charge")
	}
	return &row, res.RowsAffected > 0, nil
}

// insertCharge writes the pending row (committed before any call to Stripe). A row already
// there — a concurrent identical request, or a conflicting one — is left alone.
//
// The conflict target is left open on purpose: the row has two unique keys, order_id and the
// idempotency_key derived from it, and an insert racing a concurrent one may collide on either.
// ON CONFLICT (order_id) would turn a collision on the other into a unique violation (a 500).
//
// The new row is the charge's first answer (pending): the app is told in the insert's
// transaction.
func (s *Service) insertCharge(ctx context.Context, req chargeRequest, hash, stripeCustomerID string) error {
	now := s.now().UTC()
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec(`
			INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, description,
				request_hash, idempotency_key, livemode, state, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)
			ON CONFLICT DO NOTHING`,
			req.OrderID, req.UserID, stripeCustomerID, req.Amount, req.Currency, req.Description,
			hash, ChargeKey(req.OrderID), s.livemode, statePending, now)
		if res.Error != nil || res.RowsAffected == 0 {
			// A row already there is another request's, told by its own insert.
			return res.Error
		}
		return s.tellCharge(ctx, tx, req.OrderID, req.UserID, s.livemode)
	})
	return database.APIError(err, "insert charge")
}

func chargeConflict(row *chargeRow, req chargeRequest) error {
	var diff []string
	if row.UserID != req.UserID {
		diff = append(diff, "user_id")
	}
	if row.Amount != req.Amount {
		diff = append(diff, "amount")
	}
	if row.Currency != req.Currency {
		diff = append(diff, "currency")
	}
	if (row.Description == nil) != (req.Description == nil) ||
		(row.Description != nil && *row.Description != *req.Description) {
		diff = append(diff, "description")
	}
	what := "other values"
	if len(diff) > 0 {
		what = "another " + strings.Join(diff, ", ")
	}
	return apierr.New(apierr.CodeIdempotencyConflict,
		"order_id %s was already charged with %s; use a new order_id for a different charge", req.OrderID, what).
		With("order_id", req.OrderID)
}

// resolvePaymentMethod records, once per order and before the first attempt, the payment method
// to charge: the customer's invoice_settings.default_payment_method. Stripe does not use that one
// by itself (only the legacy default_source), so it must be sent; it is stored so that every
// retry under the key sends the same parameters even if the customer's default changes meanwhile.
// Concurrent requests may both look it up; the first stored value wins.
func (s *Service) resolvePaymentMethod(ctx context.Context, row *chargeRow) error {
	params := &stripe.CustomerParams{}
	params.Context = ctx
	pm := ""
	sc, err := s.stripe.Customers.Get(row.StripeCustomerID, params)
	switch {
	case err != nil && stripeclient.Retryable(err):
		return unavailable(err, "look up the customer's payment method")
	case err != nil:
		// Let the charge itself report what Stripe thinks of this customer.
		s.log.WarnContext(ctx, "customer lookup refused; charging without an explicit payment method",
			"order_id", row.OrderID, "stripe_customer_id", row.StripeCustomerID, stripeclient.LogAttr(err))
	case sc.InvoiceSettings != nil && sc.InvoiceSettings.DefaultPaymentMethod != nil:
		pm = sc.InvoiceSettings.DefaultPaymentMethod.ID
	}
	err = s.db.WithContext(ctx).Exec(`
		UPDATE charges SET payment_method_id = $1, updated_at = $2
		WHERE order_id = $3 AND livemode = $4 AND payment_method_id IS NULL AND state = $5`,
		pm, s.now().UTC(), row.OrderID, s.livemode, statePending).Error
	return database.APIError(err, "store payment method")
}

// chargeOutcome is Stripe's final answer about a charge.
type chargeOutcome struct {
	status          string // ledger status
	paymentIntentID string
	declineCode     string
	apiErr          *apierr.Error // the answer when it is not a success
}

// finishCharge finishes a pending row through the outbound protocol; see the package doc.
func (s *Service) finishCharge(ctx context.Context, orderID string) reply {
	var (
		row chargeRow
		rep reply
	)
	complete := func(tx *gorm.DB, out chargeOutcome, a outbound.Attempt) error {
		var err error
		rep, err = s.completeCharge(ctx, tx, &row, out, a.At)
		return err
	}
	res, err := outbound.Run(ctx, s.db, outbound.Call[*stripe.PaymentIntent]{
		Lock: outbound.Select{SQL: `SELECT * FROM charges WHERE order_id = $1 AND livemode = $2`, Args: []any{orderID, s.livemode}, Into: &row},
		Locked: func(*gorm.DB) (outbound.State, error) {
			return outbound.State{Key: row.IdempotencyKey, CreatedAt: row.CreatedAt, Done: row.State == stateCompleted}, nil
		},
		Find: func(ctx context.Context) (*stripe.PaymentIntent, bool, error) {
			return s.findPaymentIntent(ctx, orderID)
		},
		Create: func(p stripe.Params) (*stripe.PaymentIntent, error) {
			return s.stripe.PaymentIntents.New(paymentIntentParams(p, &row))
		},
		Complete: func(tx *gorm.DB, pi *stripe.PaymentIntent, a outbound.Attempt) error {
			return complete(tx, paymentIntentOutcome(pi), a)
		},
		Refuse: func(tx *gorm.DB, a outbound.Attempt) error {
			out, err := chargeRefusal(a.Err)
			if err != nil {
				return err
			}
			return complete(tx, out, a)
		},
		RecordAttempt: func(tx *gorm.DB, a outbound.Attempt) error {
			apiErr := unfinished(a, "charge")
			if err := tx.Exec(`
				UPDATE charges SET attempts = attempts + 1, last_attempt_at = $1, error_code = $2, updated_at = $1
				WHERE order_id = $3 AND livemode = $4`, a.At, string(apiErr.Code), orderID, s.livemode).Error; err != nil {
				return fmt.Errorf("record charge attempt: %w", err)
			}
			rep = reply{Err: apiErr}
			return nil
		},
		Now: s.now,
		Log: s.log.With("order_id", orderID),
	})
	if err != nil {
		return reply{Err: database.APIError(err, "finish charge")}
	}
	switch res.Outcome {
	case outbound.AlreadyDone:
		// A concurrent identical request finished it while we waited for the lock.
		return answerOf(row.Answer, &chargeBody{}, false)
	case outbound.Gone:
		return reply{Err: apierr.Internal(fmt.Errorf("charge row of order %q vanished", orderID))}
	}
	return rep
}

// completeCharge records Stripe's final answer in the locked row and answers it.
func (s *Service) completeCharge(ctx context.Context, tx *gorm.DB, row *chargeRow, out chargeOutcome, at time.Time) (reply, error) {
	var body any
	var errorCode *string
	if out.apiErr == nil {
		body = chargeBody{
			OrderID: row.OrderID, Status: out.status, PaymentIntentID: out.paymentIntentID,
			Amount: row.Amount, Currency: row.Currency, IdempotencyKey: row.IdempotencyKey,
		}
	} else {
		code := string(out.apiErr.Code)
		errorCode = &code
	}
	answer, err := outbound.EncodeAnswer(body, out.apiErr)
	if err != nil {
		return reply{}, apierr.Internal(err)
	}
	// A status that an event already settled (settle.go) is newer than the create's answer,
	// unless that answer is final.
	if err := tx.Exec(`
		UPDATE charges SET state = $1,
			status = CASE WHEN pi_event_created IS NULL OR CAST($2 AS text) IN `+chargeFinalSQL+` THEN CAST($2 AS text) ELSE status END,
			payment_intent_id = coalesce(NULLIF($3, ''), payment_intent_id), answer = CAST($4 AS jsonb),
			error_code = $5, decline_code = NULLIF($6, ''), attempts = attempts + 1, last_attempt_at = $7,
			completed_at = $7, updated_at = $7
		WHERE order_id = $8 AND livemode = $9`,
		stateCompleted, out.status, out.paymentIntentID, answer, errorCode, out.declineCode, at,
		row.OrderID, row.Livemode).Error; err != nil {
		return reply{}, fmt.Errorf("complete charge: %w", err)
	}
	if err := s.tellCharge(ctx, tx, row.OrderID, row.UserID, row.Livemode); err != nil {
		return reply{}, err
	}
	s.log.InfoContext(ctx, "charge completed", "order_id", row.OrderID, "status", out.status,
		"payment_intent_id", out.paymentIntentID, "decline_code", out.declineCode)
	return answerOf(&answer, &chargeBody{}, true), nil
}

// paymentIntentParams asks for the order's PaymentIntent: confirmed at once, off-session, on the
// payment method recorded with the row. p carries the order's key.
func paymentIntentParams(p stripe.Params, row *chargeRow) *stripe.PaymentIntentParams {
	params := &stripe.PaymentIntentParams{
		Params:     p,
		Amount:     stripe.Int64(row.Amount),
		Currency:   stripe.String(row.Currency),
		Customer:   stripe.String(row.StripeCustomerID),
		Confirm:    stripe.Bool(true),
		OffSession: stripe.Bool(true),
		// A server-side confirmation has no page to return to: never pick a redirect-based
		// method (otherwise Stripe demands a return_url).
		AutomaticPaymentMethods: &stripe.PaymentIntentAutomaticPaymentMethodsParams{
			Enabled:        stripe.Bool(true),
			AllowRedirects: stripe.String("never"),
		},
		Description: row.Description,
		Metadata:    map[string]string{"order_id": row.OrderID, "user_id": row.UserID},
	}
	if row.PaymentMethodID != nil && *row.PaymentMethodID != "" {
		params.PaymentMethod = row.PaymentMethodID
	}
	return params
}

// findPaymentIntent looks up the PaymentIntent made for an order by an earlier attempt.
func (s *Service) findPaymentIntent(ctx context.Context, orderID string) (*stripe.PaymentIntent, bool, error) {
	params := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{
		Context: ctx,
		// Order ids are [A-Za-z0-9_-]: nothing to escape in the query.
		Query: fmt.Sprintf("metadata['order_id']:'%s'", orderID),
	}}
	it := s.stripe.PaymentIntents.Search(params)
	for it.Next() {
		if pi := it.PaymentIntent(); pi.Metadata["order_id"] == orderID {
			return pi, true, nil
		}
	}
	if err := it.Err(); err != nil {
		return nil, false, fmt.Errorf("search payment intent of order %q: %w", orderID, err)
	}
	return nil, false, nil
}

// paymentIntentOutcome maps a PaymentIntent that Stripe returned to the final answer.
func paymentIntentOutcome(pi *stripe.PaymentIntent) chargeOutcome {
	switch pi.Status {
	case stripe.PaymentIntentStatusSucceeded, stripe.PaymentIntentStatusProcessing, stripe.PaymentIntentStatusRequiresCapture:
		return chargeOutcome{status: string(pi.Status), paymentIntentID: pi.ID}
	case stripe.PaymentIntentStatusRequiresAction, stripe.PaymentIntentStatusRequiresConfirmation:
		return authenticationRequired(pi.ID, "")
	default:
		// requires_payment_method after a confirmation attempt (or canceled): the payment failed.
		var code, msg string
		if e := pi.LastPaymentError; e != nil {
			code, msg = string(e.DeclineCode), e.Msg
			if code == "" {
				code = string(e.Code)
			}
		}
		return declined(pi.ID, code, msg)
	}
}

// chargeRefusal maps Stripe's final refusal of a charge (outbound.Final): a card error is a
// decline (or a demand for authentication), anything else a failed charge.
func chargeRefusal(err error) (chargeOutcome, error) {
	var se *stripe.Error
	if !errors.As(err, &se) {
		return chargeOutcome{}, apierr.Internal(fmt.Errorf("charge refusal without a Stripe error: %w", stripeclient.Redact(err)))
	}
	if se.Type == stripe.ErrorTypeCard {
		piID := ""
		if se.PaymentIntent != nil {
			piID = se.PaymentIntent.ID
		}
		if se.Code == stripe.ErrorCodeAuthenticationRequired {
			return authenticationRequired(piID, se.Msg), nil
		}
		code := string(se.DeclineCode)
		if code == "" {
			code = string(se.Code)
		}
		return declined(piID, code, se.Msg), nil
	}
	return chargeOutcome{status: chargeFailed, apiErr: refused(err, apierr.CodeChargeFailed,
		"Stripe refused the charge: %s", se.Msg).With("stripe_code", string(se.Code))}, nil
}

func authenticationRequired(piID, msg string) chargeOutcome {
	if msg == "" {
		msg = "The payment needs the customer to authenticate it (3-D Secure) on session."
	}
	return chargeOutcome{
		status: string(stripe.PaymentIntentStatusRequiresAction), paymentIntentID: piID,
		apiErr: apierr.New(apierr.CodeAuthenticationRequire, "%s", msg).With("payment_intent_id", piID),
	}
}

func declined(piID, declineCode, msg string) chargeOutcome {
	if msg == "" {
		msg = "The card was declined."
	}
	return chargeOutcome{
		status: chargeDeclined, paymentIntentID: piID, declineCode: declineCode,
		apiErr: apierr.New(apierr.CodeCardDeclined, "%s", msg).
			With("decline_code", declineCode).With("payment_intent_id", piID),
	}
}
