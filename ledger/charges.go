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
	"billing/internal/stripeclient"
)

// Charge statuses of a completed row besides Stripe's own PaymentIntent statuses (succeeded,
// processing, requires_capture, requires_action).
const (
	chargeDeclined = "declined" // a card error: the answer is a 402 card_declined
	chargeFailed   = "failed"   // any other final refusal by Stripe: 422 charge_failed
)

// ChargeKey is the Stripe idempotency key of an order's charge.
func ChargeKey(orderID string) string { return "charge-" + orderID }

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

// chargeRow is a row of the charges table.
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
	CreatedAt        time.Time
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
	return s.charge(ctx, req).write(c)
}

// charge runs the ledger path of the package doc for one order.
func (s *Service) charge(ctx context.Context, req chargeRequest) reply {
	hash := requestHash(req)
	row, found, err := s.loadCharge(ctx, s.db, req.OrderID, false)
	if err != nil {
		return reply{err: err}
	}
	if !found {
		cust, err := customers.Get(ctx, s.db, req.UserID, s.livemode)
		if errors.Is(err, customers.ErrNotFound) {
			return reply{err: apierr.New(apierr.CodeNoCustomer, "user %s has no Stripe customer; PUT /v1/customers/%s first", req.UserID, req.UserID)}
		}
		if err != nil {
			return reply{err: database.APIError(err, "load customer")}
		}
		if err := s.insertCharge(ctx, req, hash, cust.StripeID()); err != nil {
			return reply{err: err}
		}
		// Read back what is there: ours, or a concurrent request's row (which may conflict).
		if row, found, err = s.loadCharge(ctx, s.db, req.OrderID, false); err != nil {
			return reply{err: err}
		} else if !found {
			return reply{err: apierr.Internal(fmt.Errorf("charge row of order %q vanished after insert", req.OrderID))}
		}
	}
	if row.Livemode != s.livemode {
		return reply{err: modeConflict("order "+req.OrderID, row.Livemode)}
	}
	if row.RequestHash != hash {
		return reply{err: chargeConflict(row, req)}
	}
	if row.State == stateCompleted {
		return answerOf(row.Answer, &chargeBody{}, false)
	}
	if row.PaymentMethodID == nil {
		if err := s.resolvePaymentMethod(ctx, row); err != nil {
			return reply{err: err}
		}
	}
	return s.finishCharge(ctx, req.OrderID)
}

func (s *Service) loadCharge(ctx context.Context, db *gorm.DB, orderID string, lock bool) (*chargeRow, bool, error) {
	q := `SELECT * FROM charges WHERE order_id = ?`
	if lock {
		q += ` FOR UPDATE`
	}
	var row chargeRow
	res := db.WithContext(ctx).Raw(q, orderID).Scan(&row)
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
func (s *Service) insertCharge(ctx context.Context, req chargeRequest, hash, stripeCustomerID string) error {
	now := s.now().UTC()
	err := s.db.WithContext(ctx).Exec(`
		INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, description,
			request_hash, idempotency_key, livemode, state, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT DO NOTHING`,
		req.OrderID, req.UserID, stripeCustomerID, req.Amount, req.Currency, req.Description,
		hash, ChargeKey(req.OrderID), s.livemode, statePending, now, now).Error
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
		UPDATE charges SET payment_method_id = ?, updated_at = ?
		WHERE order_id = ? AND payment_method_id IS NULL AND state = ?`,
		pm, s.now().UTC(), row.OrderID, statePending).Error
	return database.APIError(err, "store payment method")
}

// chargeOutcome is what one attempt at Stripe came to.
type chargeOutcome struct {
	final           bool   // Stripe's answer is known: complete the row
	status          string // ledger status (final only)
	paymentIntentID string
	declineCode     string
	apiErr          *apierr.Error // the answer when it is not a success
}

// finishCharge completes a pending row under its lock; see the package doc.
func (s *Service) finishCharge(ctx context.Context, orderID string) reply {
	var rep reply
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		row, found, err := s.loadCharge(ctx, tx, orderID, true)
		if err != nil {
			return err
		}
		if !found {
			return apierr.Internal(fmt.Errorf("charge row of order %q vanished", orderID))
		}
		if row.State == stateCompleted {
			// A concurrent identical request finished it while we waited for the lock.
			rep = answerOf(row.Answer, &chargeBody{}, false)
			return nil
		}
		out := s.attemptCharge(ctx, row)
		now := s.now().UTC()
		if !out.final {
			// Keep the row pending (the next identical request finishes it), but keep the
			// attempt's trace for operators.
			if err := tx.Exec(`
				UPDATE charges SET attempts = attempts + 1, last_attempt_at = ?, error_code = ?, updated_at = ?
				WHERE order_id = ?`, now, string(out.apiErr.Code), now, orderID).Error; err != nil {
				return database.APIError(err, "record charge attempt")
			}
			rep = reply{err: out.apiErr}
			return nil
		}
		var body any
		if out.apiErr == nil {
			body = chargeBody{
				OrderID: row.OrderID, Status: out.status, PaymentIntentID: out.paymentIntentID,
				Amount: row.Amount, Currency: row.Currency, IdempotencyKey: row.IdempotencyKey,
			}
		}
		answer, err := encodeAnswer(body, out.apiErr)
		if err != nil {
			return apierr.Internal(err)
		}
		var errorCode *string
		if out.apiErr != nil {
			code := string(out.apiErr.Code)
			errorCode = &code
		}
		if err := tx.Exec(`
			UPDATE charges SET state = ?, status = ?, payment_intent_id = NULLIF(?, ''), answer = CAST(? AS jsonb),
				error_code = ?, decline_code = NULLIF(?, ''), attempts = attempts + 1, last_attempt_at = ?,
				completed_at = ?, updated_at = ?
			WHERE order_id = ?`,
			stateCompleted, out.status, out.paymentIntentID, answer, errorCode, out.declineCode, now, now, now,
			orderID).Error; err != nil {
			return database.APIError(err, "complete charge")
		}
		s.log.InfoContext(ctx, "charge completed", "order_id", orderID, "status", out.status,
			"payment_intent_id", out.paymentIntentID, "decline_code", out.declineCode)
		rep = answerOf(&answer, &chargeBody{}, true)
		return nil
	})
	if err != nil {
		return reply{err: database.APIError(err, "finish charge")}
	}
	return rep
}

// attemptCharge asks Stripe for the order's PaymentIntent: confirmed at once, off-session,
// on the customer's payment method, under the order's key.
func (s *Service) attemptCharge(ctx context.Context, row *chargeRow) chargeOutcome {
	if s.now().Sub(row.CreatedAt) >= keyWindow {
		pi, err := s.findPaymentIntent(ctx, row.OrderID)
		if err != nil {
			return chargeOutcome{apiErr: lookupFailed(err, "charge")}
		}
		if pi != nil {
			s.log.InfoContext(ctx, "payment intent of an old pending charge found by search",
				"order_id", row.OrderID, "payment_intent_id", pi.ID)
			return paymentIntentOutcome(pi)
		}
	}
	params := &stripe.PaymentIntentParams{
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
	params.Context = ctx
	params.SetIdempotencyKey(row.IdempotencyKey)
	pi, err := s.stripe.PaymentIntents.New(params)
	if err != nil {
		if !stripeclient.Retryable(err) {
			s.log.WarnContext(ctx, "charge refused by Stripe", "order_id", row.OrderID, stripeclient.LogAttr(err))
		} else {
			s.log.WarnContext(ctx, "charge attempt failed; row stays pending", "order_id", row.OrderID, stripeclient.LogAttr(err))
		}
		return chargeErrorOutcome(err)
	}
	return paymentIntentOutcome(pi)
}

// findPaymentIntent looks up the PaymentIntent made for an order by an earlier attempt.
func (s *Service) findPaymentIntent(ctx context.Context, orderID string) (*stripe.PaymentIntent, error) {
	params := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{
		Context: ctx,
		// Order ids are [A-Za-z0-9_-]: nothing to escape in the query.
		Query: fmt.Sprintf("metadata['order_id']:'%s'", orderID),
	}}
	it := s.stripe.PaymentIntents.Search(params)
	for it.Next() {
		if pi := it.PaymentIntent(); pi.Metadata["order_id"] == orderID {
			return pi, nil
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("search payment intent of order %q: %w", orderID, err)
	}
	return nil, nil
}

// paymentIntentOutcome maps a PaymentIntent that Stripe returned to the final answer.
func paymentIntentOutcome(pi *stripe.PaymentIntent) chargeOutcome {
	switch pi.Status {
	case stripe.PaymentIntentStatusSucceeded, stripe.PaymentIntentStatusProcessing, stripe.PaymentIntentStatusRequiresCapture:
		return chargeOutcome{final: true, status: string(pi.Status), paymentIntentID: pi.ID}
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

// chargeErrorOutcome maps a failed call.
func chargeErrorOutcome(err error) chargeOutcome {
	var se *stripe.Error
	if stripeclient.Retryable(err) || !errors.As(err, &se) {
		return chargeOutcome{apiErr: unavailable(err, "charge")}
	}
	switch {
	case se.Type == stripe.ErrorTypeCard:
		piID := ""
		if se.PaymentIntent != nil {
			piID = se.PaymentIntent.ID
		}
		if se.Code == stripe.ErrorCodeAuthenticationRequired {
			return authenticationRequired(piID, se.Msg)
		}
		code := string(se.DeclineCode)
		if code == "" {
			code = string(se.Code)
		}
		return declined(piID, code, se.Msg)
	case stripeMisconfigured(se):
		return chargeOutcome{apiErr: refused(err, apierr.CodeStripeError, "Stripe refused the call; the charge stays pending")}
	default:
		return chargeOutcome{final: true, status: chargeFailed, apiErr: refused(err, apierr.CodeChargeFailed,
			"Stripe refused the charge: %s", se.Msg).With("stripe_code", string(se.Code))}
	}
}

func authenticationRequired(piID, msg string) chargeOutcome {
	if msg == "" {
		msg = "The payment needs the customer to authenticate it (3-D Secure) on session."
	}
	return chargeOutcome{
		final: true, status: string(stripe.PaymentIntentStatusRequiresAction), paymentIntentID: piID,
		apiErr: apierr.New(apierr.CodeAuthenticationRequire, "%s", msg).With("payment_intent_id", piID),
	}
}

func declined(piID, declineCode, msg string) chargeOutcome {
	if msg == "" {
		msg = "The card was declined."
	}
	return chargeOutcome{
		final: true, status: chargeDeclined, paymentIntentID: piID, declineCode: declineCode,
		apiErr: apierr.New(apierr.CodeCardDeclined, "%s", msg).
			With("decline_code", declineCode).With("payment_intent_id", piID),
	}
}
