package checkout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/entitlements"
	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/ids"
	"billing/internal/outbound"
	"billing/internal/stripeclient"
)

// Row states.
const (
	statePending   = "pending"
	stateCompleted = "completed"
)

// Limits of the request's numbers, Stripe's own.
const (
	// maxQuantity is the most seats one request may buy: above it is a typo, not a sale.
	maxQuantity        = 10_000
	maxTrialPeriodDays = 730
	maxURLLength       = 2048
)

// SessionKey is the Stripe idempotency key of a user's checkout request.
func SessionKey(userID, requestID string) string { return outbound.Key("checkout", userID, requestID) }

type createRequestJSON struct {
	RequestID       *string `json:"request_id"`
	PriceID         *string `json:"price_id"`
	Quantity        *int64  `json:"quantity"`
	TrialPeriodDays *int64  `json:"trial_period_days"`
	SuccessURL      *string `json:"success_url"`
	CancelURL       *string `json:"cancel_url"`
	// The price by its lookup key instead of price_id.
	PriceLookupKey *string `json:"price_lookup_key"`
	// PromotionCode is the code the customer typed; AllowPromotionCodes lets them type it at
	// Stripe instead. One or the other: Stripe takes not both.
	PromotionCode       *string `json:"promotion_code"`
	AllowPromotionCodes *bool   `json:"allow_promotion_codes"`
}

// createRequest is a validated request; its JSON encoding (fixed field order, the URLs as the
// client gave them) is what request_hash hashes.
type createRequest struct {
	RequestID       string  `json:"request_id"`
	PriceID         string  `json:"price_id"`
	Quantity        int64   `json:"quantity"`
	TrialPeriodDays *int64  `json:"trial_period_days"`
	SuccessURL      *string `json:"success_url"`
	CancelURL       *string `json:"cancel_url"`
	// The fields of the fourth round come last and are left out when not given, so that a
	// request of the earlier shape hashes as it always did.
	PriceLookupKey      *string `json:"price_lookup_key,omitempty"`
	PromotionCode       *string `json:"promotion_code,omitempty"`
	AllowPromotionCodes bool    `json:"allow_promotion_codes,omitempty"`
}

func (r createRequest) hash() string {
	b, err := json.Marshal(r)
	if err != nil {
		// Only strings and integers are hashed; this cannot fail.
		panic(fmt.Sprintf("checkout: hash request: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// sessionBody is the success answer of POST /v1/customers/{user_id}/checkout-sessions.
type sessionBody struct {
	ID             string    `json:"id"`
	URL            string    `json:"url"`
	ExpiresAt      time.Time `json:"expires_at"`
	IdempotencyKey string    `json:"idempotency_key"`
}

// sessionRow is a row of checkout_sessions, scanned by column name.
type sessionRow struct {
	ID               int64
	Livemode         bool
	UserID           *string
	StripeCustomerID *string
	RequestID        *string
	RequestHash      *string
	IdempotencyKey   *string
	PriceID          *string
	Quantity         *int64
	TrialPeriodDays  *int64
	SuccessURL       *string
	CancelURL        *string
	State            string
	Answer           *string
	Attempts         int
	SessionID        *string
	SessionStatus    *string
	PaymentStatus    *string
	SubscriptionID   *string
	CreatedAt        time.Time
	// PromotionCodeID is Stripe's promotion code that the typed PromotionCode resolved to.
	PromotionCode       *string
	PromotionCodeID     *string
	AllowPromotionCodes bool
	AutomaticTax        bool
}

func parseCreateRequest(c echo.Context) (createRequest, error) {
	var raw createRequestJSON
	if err := httpserver.DecodeJSON(c, &raw, false); err != nil {
		return createRequest{}, err
	}
	var req createRequest
	if raw.RequestID == nil {
		return req, apierr.New(apierr.CodeInvalidRequestID, "request_id is required")
	}
	if err := ids.Check(*raw.RequestID, "request_id", apierr.CodeInvalidRequestID); err != nil {
		return req, err
	}
	req.RequestID = *raw.RequestID
	switch {
	case raw.PriceID == nil && raw.PriceLookupKey == nil:
		return req, apierr.New(apierr.CodeInvalidPriceID, "price_id or price_lookup_key is required")
	case raw.PriceID != nil && raw.PriceLookupKey != nil:
		return req, apierr.New(apierr.CodeInvalidRequest, "give price_id or price_lookup_key, not both")
	case raw.PriceID != nil:
		if err := ids.Check(*raw.PriceID, "price_id", apierr.CodeInvalidPriceID); err != nil {
			return req, err
		}
		req.PriceID = *raw.PriceID
	default:
		req.PriceLookupKey = raw.PriceLookupKey
	}
	if raw.PromotionCode != nil {
		if err := checkPromotionCode(*raw.PromotionCode); err != nil {
			return req, err
		}
		req.PromotionCode = raw.PromotionCode
	}
	req.AllowPromotionCodes = raw.AllowPromotionCodes != nil && *raw.AllowPromotionCodes
	if req.PromotionCode != nil && req.AllowPromotionCodes {
		return req, apierr.New(apierr.CodeInvalidRequest, "give promotion_code or allow_promotion_codes, not both: Stripe applies one code per session")
	}
	req.Quantity = 1
	if raw.Quantity != nil {
		if *raw.Quantity < 1 || *raw.Quantity > maxQuantity {
			return req, apierr.New(apierr.CodeInvalidQuantity, "quantity must be an integer from 1 to %d", maxQuantity)
		}
		req.Quantity = *raw.Quantity
	}
	if raw.TrialPeriodDays != nil {
		if *raw.TrialPeriodDays < 1 || *raw.TrialPeriodDays > maxTrialPeriodDays {
			return req, apierr.New(apierr.CodeInvalidTrialPeriodDays, "trial_period_days must be an integer from 1 to %d", maxTrialPeriodDays)
		}
		req.TrialPeriodDays = raw.TrialPeriodDays
	}
	for _, u := range []struct {
		name string
		raw  *string
		dst  **string
	}{{"success_url", raw.SuccessURL, &req.SuccessURL}, {"cancel_url", raw.CancelURL, &req.CancelURL}} {
		if u.raw == nil {
			continue
		}
		if err := checkURL(u.name, *u.raw); err != nil {
			return req, err
		}
		*u.dst = u.raw
	}
	return req, nil
}

// checkURL accepts absolute http(s) URLs. Stripe's {CHECKOUT_SESSION_ID} placeholder in a
// success URL parses as part of its query.
func checkURL(name, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(raw) > maxURLLength {
		return apierr.New(apierr.CodeInvalidURL, "%s must be an absolute http or https URL of at most %d characters", name, maxURLLength)
	}
	return nil
}

// urls resolves the request's URLs against the configured defaults.
func (s *Service) urls(req createRequest) (success, cancel string, err error) {
	success, cancel = s.successURL, s.cancelURL
	if req.SuccessURL != nil {
		success = *req.SuccessURL
	}
	if req.CancelURL != nil {
		cancel = *req.CancelURL
	}
	if success == "" {
		return "", "", apierr.New(apierr.CodeInvalidURL, "success_url is required: the request gives none and checkout.success_url is not configured")
	}
	if cancel == "" {
		return "", "", apierr.New(apierr.CodeInvalidURL, "cancel_url is required: the request gives none and checkout.cancel_url is not configured")
	}
	return success, cancel, nil
}

func (s *Service) postSession(c echo.Context) error {
	userID := c.Param("user_id")
	if err := ids.CheckUser(userID); err != nil {
		return err
	}
	req, err := parseCreateRequest(c)
	if err != nil {
		return err
	}
	// Once Stripe may have acted, the answer is recorded even if the client has gone.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), httpserver.OutboundBudget)
	defer cancel()
	return s.create(ctx, userID, req).Write(c)
}

// create runs the outbound path of the package doc for one request.
func (s *Service) create(ctx context.Context, userID string, req createRequest) reply {
	hash := req.hash()
	row, found, err := s.loadRequest(ctx, userID, req.RequestID)
	if err != nil {
		return reply{Err: err}
	}
	if !found {
		// The refusals come before anything is recorded, so that the same request_id can be
		// used again once they no longer hold. Linking first also refuses a user of the other
		// mode (livemode_conflict); a user without a customer cannot be entitled.
		// What Stripe would refuse is refused here, before anything is recorded or made: a price
		// the catalog knows to be inactive, a lookup key it does not know, and below, once the
		// customer is known, a code Stripe will not take.
		priceID, err := s.priceOf(ctx, req)
		if err != nil {
			return reply{Err: err}
		}
		cust, err := s.customers.EnsureLinked(ctx, userID)
		if err != nil {
			return reply{Err: err}
		}
		if err := s.refuseEntitled(ctx, userID); err != nil {
			return reply{Err: err}
		}
		success, cancel, err := s.urls(req)
		if err != nil {
			return reply{Err: err}
		}
		var promo *string
		if req.PromotionCode != nil {
			if promo, err = s.promotionCode(ctx, *req.PromotionCode, cust.StripeID()); err != nil {
				return reply{Err: err}
			}
		}
		if err := s.insertRequest(ctx, userID, req, hash, cust.StripeID(), success, cancel, priceID, promo); err != nil {
			return reply{Err: err}
		}
		if row, found, err = s.loadRequest(ctx, userID, req.RequestID); err != nil {
			return reply{Err: err}
		} else if !found {
			// The key checkout-{user_id}-{request_id} is another user's request's key.
			return reply{Err: apierr.New(apierr.CodeIdempotencyConflict,
				"the idempotency key %s is taken by another request; use another request_id", SessionKey(userID, req.RequestID)).
				With("request_id", req.RequestID)}
		}
	}
	if row.RequestHash == nil || *row.RequestHash != hash {
		return reply{Err: apierr.New(apierr.CodeIdempotencyConflict,
			"request_id %s was already used with other values; use a new request_id for another session", req.RequestID).
			With("request_id", req.RequestID)}
	}
	if row.State == stateCompleted {
		return answerOf(row.Answer, false)
	}
	return s.finish(ctx, row.ID, userID, req.RequestID)
}

// refuseEntitled answers 409 already_subscribed while the user has an entitled subscription.
func (s *Service) refuseEntitled(ctx context.Context, userID string) error {
	e, err := s.ents.Entitlement(ctx, userID)
	if errors.Is(err, entitlements.ErrNoCustomer) {
		return nil
	}
	if err != nil {
		return database.APIError(err, "load entitlement")
	}
	if e.Entitled {
		ae := apierr.New(apierr.CodeAlreadySubscribed, "user %s already has an entitled subscription; change it instead", userID)
		if e.SubscriptionID != nil {
			ae = ae.With("subscription_id", *e.SubscriptionID)
		}
		return ae
	}
	return nil
}

func (s *Service) loadRequest(ctx context.Context, userID, requestID string) (*sessionRow, bool, error) {
	var row sessionRow
	res := s.db.WithContext(ctx).Raw(`SELECT * FROM checkout_sessions WHERE user_id = $1 AND request_id = $2 AND livemode = $3`,
		userID, requestID, s.livemode).Scan(&row)
	if res.Error != nil {
		return nil, false, database.APIError(res.Error, "load checkout request")
	}
	return &row, res.RowsAffected > 0, nil
}

// insertRequest writes the pending row, committed before any call to Stripe. A row already there
// (a concurrent identical request, a conflicting one, or another request with the same key) is
// left alone: the conflict target is open because either unique key may collide.
func (s *Service) insertRequest(ctx context.Context, userID string, req createRequest, hash, stripeCustomerID, success, cancel, priceID string, promo *string) error {
	now := s.now().UTC()
	err := s.db.WithContext(ctx).Exec(`
		INSERT INTO checkout_sessions (livemode, user_id, stripe_customer_id, request_id, request_hash, idempotency_key,
			price_id, quantity, trial_period_days, success_url, cancel_url, state, created_at, updated_at,
			promotion_code, promotion_code_id, allow_promotion_codes, automatic_tax)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14, $15, $16, $17)
		ON CONFLICT DO NOTHING`,
		s.livemode, userID, stripeCustomerID, req.RequestID, hash, SessionKey(userID, req.RequestID),
		priceID, req.Quantity, req.TrialPeriodDays, success, cancel, statePending, now,
		req.PromotionCode, promo, req.AllowPromotionCodes, s.automaticTax).Error
	return database.APIError(err, "insert checkout request")
}

// finish finishes the pending row id (the user's request requestID) through the outbound protocol.
func (s *Service) finish(ctx context.Context, id int64, userID, requestID string) reply {
	var (
		row sessionRow
		rep reply
	)
	res, err := outbound.Run(ctx, s.db, outbound.Call[*stripe.CheckoutSession]{
		Lock: outbound.Select{SQL: `SELECT * FROM checkout_sessions WHERE id = $1 AND livemode = $2`, Args: []any{id, s.livemode}, Into: &row},
		Locked: func(*gorm.DB) (outbound.State, error) {
			return outbound.State{Key: deref(row.IdempotencyKey), CreatedAt: row.CreatedAt, Done: row.State == stateCompleted}, nil
		},
		Find: func(ctx context.Context) (*stripe.CheckoutSession, bool, error) { return s.findSession(ctx, &row) },
		Create: func(p stripe.Params) (*stripe.CheckoutSession, error) {
			return s.stripe.CheckoutSessions.New(sessionParams(p, &row))
		},
		Complete: func(tx *gorm.DB, cs *stripe.CheckoutSession, a outbound.Attempt) error {
			var err error
			rep, err = s.complete(ctx, tx, &row, cs, a)
			return err
		},
		Refuse: func(tx *gorm.DB, a outbound.Attempt) error {
			var err error
			rep, err = s.refuse(ctx, tx, &row, a)
			return err
		},
		RecordAttempt: func(tx *gorm.DB, a outbound.Attempt) error {
			apiErr := unfinished(a)
			if err := tx.Exec(`
				UPDATE checkout_sessions SET attempts = attempts + 1, last_attempt_at = $1, error_code = $2, updated_at = $1
				WHERE id = $3 AND livemode = $4`, a.At, string(apiErr.Code), id, s.livemode).Error; err != nil {
				return fmt.Errorf("record checkout attempt: %w", err)
			}
			rep = reply{Err: apiErr}
			return nil
		},
		Now: s.now,
		Log: s.log.With("user_id", userID, "request_id", requestID),
	})
	if err != nil {
		return reply{Err: database.APIError(err, "finish checkout request")}
	}
	switch res.Outcome {
	case outbound.AlreadyDone:
		// A concurrent identical request finished it while we waited for the lock.
		return answerOf(row.Answer, false)
	case outbound.Gone:
		return reply{Err: apierr.Internal(fmt.Errorf("checkout row %d vanished", id))}
	}
	return rep
}

// sessionParams asks for the row's session: subscription mode, for the row's customer, with the
// row's values (never the request at hand's), so that every attempt under the key sends the same.
func sessionParams(p stripe.Params, row *sessionRow) *stripe.CheckoutSessionParams {
	md := map[string]string{"user_id": deref(row.UserID), "request_id": deref(row.RequestID)}
	params := &stripe.CheckoutSessionParams{
		Params:            p,
		Mode:              stripe.String(string(stripe.CheckoutSessionModeSubscription)),
		Customer:          row.StripeCustomerID,
		ClientReferenceID: row.UserID,
		LineItems:         []*stripe.CheckoutSessionLineItemParams{{Price: row.PriceID, Quantity: row.Quantity}},
		SuccessURL:        row.SuccessURL,
		CancelURL:         row.CancelURL,
		Metadata:          md,
		// The subscription carries the user too, for whoever reads it without the session.
		SubscriptionData: &stripe.CheckoutSessionSubscriptionDataParams{
			Metadata:        map[string]string{"user_id": deref(row.UserID)},
			TrialPeriodDays: row.TrialPeriodDays,
		},
	}
	switch {
	case row.PromotionCodeID != nil:
		params.Discounts = []*stripe.CheckoutSessionDiscountParams{{PromotionCode: row.PromotionCodeID}}
	case row.AllowPromotionCodes:
		params.AllowPromotionCodes = stripe.Bool(true)
	}
	if row.AutomaticTax {
		params.AutomaticTax = &stripe.CheckoutSessionAutomaticTaxParams{Enabled: stripe.Bool(true)}
		// Stripe Tax needs the customer's address: Checkout asks for it and keeps it on the
		// customer, so the renewals are taxed by it too.
		params.CustomerUpdate = &stripe.CheckoutSessionCustomerUpdateParams{Address: stripe.String("auto")}
		params.BillingAddressCollection = stripe.String("required")
	}
	return params
}

// findSession looks for the session an earlier attempt at the row made: the customer's sessions
// created since shortly before the row, matched on the metadata every attempt sends.
func (s *Service) findSession(ctx context.Context, row *sessionRow) (*stripe.CheckoutSession, bool, error) {
	params := &stripe.CheckoutSessionListParams{
		Customer:     row.StripeCustomerID,
		CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: row.CreatedAt.Add(-time.Hour).Unix()},
	}
	params.Context = ctx
	params.Limit = stripe.Int64(100)
	it := s.stripe.CheckoutSessions.List(params)
	for it.Next() {
		cs := it.CheckoutSession()
		if cs.Metadata["request_id"] == deref(row.RequestID) && cs.Metadata["user_id"] == deref(row.UserID) {
			return cs, true, nil
		}
	}
	if err := it.Err(); err != nil {
		return nil, false, fmt.Errorf("list checkout sessions of customer %s: %w", deref(row.StripeCustomerID), err)
	}
	return nil, false, nil
}

// complete records the session Stripe made (or Find found) in the locked row and answers it.
func (s *Service) complete(ctx context.Context, tx *gorm.DB, row *sessionRow, cs *stripe.CheckoutSession, a outbound.Attempt) (reply, error) {
	body := sessionBody{ID: cs.ID, URL: cs.URL, ExpiresAt: time.Unix(cs.ExpiresAt, 0).UTC(), IdempotencyKey: deref(row.IdempotencyKey)}
	answer, err := outbound.EncodeAnswer(body, nil)
	if err != nil {
		return reply{}, apierr.Internal(err)
	}
	// An event about the session may have recorded it already (it can only come after the
	// session exists, e.g. when an earlier attempt's answer was lost): this row takes its place.
	var earlier []sessionState
	if err := tx.Raw(`DELETE FROM checkout_sessions WHERE session_id = $1 AND livemode = $2 AND id <> $3
		RETURNING session_status, payment_status, subscription_id`, cs.ID, row.Livemode, row.ID).Scan(&earlier).Error; err != nil {
		return reply{}, fmt.Errorf("merge recorded session %s: %w", cs.ID, err)
	}
	st := sessionState{SessionStatus: nullString(string(cs.Status)), PaymentStatus: nullString(string(cs.PaymentStatus))}
	if cs.Subscription != nil {
		st.SubscriptionID = nullString(cs.Subscription.ID)
	}
	for _, e := range earlier {
		st = st.merge(e)
	}
	if err := tx.Exec(`
		UPDATE checkout_sessions SET state = $1, answer = CAST($2 AS jsonb), session_id = $3, session_status = $4,
			payment_status = $5, subscription_id = $6, url = $7, expires_at = $8, error_code = NULL,
			attempts = attempts + 1, last_attempt_at = $9, completed_at = $9, updated_at = $9
		WHERE id = $10 AND livemode = $11`,
		stateCompleted, answer, cs.ID, st.SessionStatus, st.PaymentStatus, st.SubscriptionID, cs.URL, body.ExpiresAt, a.At,
		row.ID, row.Livemode).Error; err != nil {
		return reply{}, fmt.Errorf("complete checkout request: %w", err)
	}
	s.log.InfoContext(ctx, "checkout session opened", "user_id", deref(row.UserID), "request_id", deref(row.RequestID),
		"session_id", cs.ID, "found_past_key_window", a.Step == outbound.StepFind)
	// The client never had an answer to this request: whether made now or found, it is the first.
	return answerOf(&answer, true), nil
}

// refuse records Stripe's final refusal (an unknown price, a customer Stripe does not know) as
// the request's answer: the same request_id answers it again, another request_id starts over.
func (s *Service) refuse(ctx context.Context, tx *gorm.DB, row *sessionRow, a outbound.Attempt) (reply, error) {
	apiErr := apierr.Wrap(stripeclient.Redact(a.Err), apierr.CodeCheckoutFailed, "Stripe refused to open the Checkout session: %s", stripeMessage(a.Err)).
		With("request_id", deref(row.RequestID))
	answer, err := outbound.EncodeAnswer(nil, apiErr)
	if err != nil {
		return reply{}, apierr.Internal(err)
	}
	if err := tx.Exec(`
		UPDATE checkout_sessions SET state = $1, answer = CAST($2 AS jsonb), error_code = $3,
			attempts = attempts + 1, last_attempt_at = $4, completed_at = $4, updated_at = $4
		WHERE id = $5 AND livemode = $6`,
		stateCompleted, answer, string(apiErr.Code), a.At, row.ID, row.Livemode).Error; err != nil {
		return reply{}, fmt.Errorf("record checkout refusal: %w", err)
	}
	return reply{Err: apiErr}, nil
}

func stripeMessage(err error) string {
	var se *stripe.Error
	if errors.As(err, &se) && se.Msg != "" {
		return se.Msg
	}
	return "no reason given"
}

// unfinished is the answer to an attempt that left the row pending.
func unfinished(a outbound.Attempt) *apierr.Error {
	what := "open the Checkout session"
	if a.Step == outbound.StepFind {
		what = "look up an earlier attempt at the Checkout session"
	}
	cause := fmt.Errorf("%s: %w", what, stripeclient.Redact(a.Err))
	if stripeclient.Retryable(a.Err) || a.Step == outbound.StepFind {
		return apierr.Wrap(cause, apierr.CodeStripeUnavailable, "Stripe could not be reached to %s; repeat the same request to finish it", what)
	}
	return apierr.Wrap(cause, apierr.CodeStripeError, "Stripe refused the call to %s; the request stays pending", what)
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// reply is the protocol's answer of an endpoint (outbound.Reply).
type reply = outbound.Reply

// answerOf renders a stored answer.
func answerOf(raw *string, created bool) reply { return outbound.ReplyOf(raw, &sessionBody{}, created) }
