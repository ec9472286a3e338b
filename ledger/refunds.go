package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/outbound"
	"billing/internal/stripeclient"
)

// refundError is the ledger status of a refund that Stripe refused (422 refund_failed).
const refundError = "error"

// RefundKey is the Stripe idempotency key of a refund. The contract fixes this format; since ids
// may contain '-', two (order, refund) pairs can spell the same key, which the UNIQUE
// refunds.idempotency_key turns into a 409 instead of a Stripe-side clash.
func RefundKey(orderID, refundID string) string { return outbound.Key("refund", orderID, refundID) }

type refundRequestJSON struct {
	RefundID json.RawMessage `json:"refund_id"`
	Amount   json.RawMessage `json:"amount"`
	Reason   json.RawMessage `json:"reason"`
}

// refundRequest is a validated refund request; its JSON encoding is what request_hash hashes.
// Amount is nil when omitted (the whole remainder): a repeat that omits it again is the same
// request, whatever the remainder has become since.
type refundRequest struct {
	OrderID  string  `json:"order_id"`
	RefundID string  `json:"refund_id"`
	Amount   *int64  `json:"amount"`
	Reason   *string `json:"reason"`
}

// refundBody is the success answer of POST /v1/charges/{order_id}/refunds.
type refundBody struct {
	RefundID       string `json:"refund_id"`
	OrderID        string `json:"order_id"`
	Status         string `json:"status"`
	StripeRefundID string `json:"stripe_refund_id"`
	Amount         int64  `json:"amount"`
	IdempotencyKey string `json:"idempotency_key"`
}

// refundRow is a row of the refunds table, scanned by column name.
type refundRow struct {
	OrderID        string
	RefundID       string
	Amount         int64
	Reason         *string
	RequestHash    string
	IdempotencyKey string
	State          string
	Status         *string
	StripeRefundID *string
	Answer         *string
	Livemode       bool
	CreatedAt      time.Time
}

func parseRefundRequest(c echo.Context) (refundRequest, error) {
	req := refundRequest{OrderID: c.Param("order_id")}
	if err := checkID(req.OrderID, "order_id", apierr.CodeInvalidOrderID); err != nil {
		return req, err
	}
	var raw refundRequestJSON
	if err := httpserver.DecodeJSON(c, &raw, false); err != nil {
		return req, err
	}
	var err error
	if req.RefundID, err = idField(raw.RefundID, "refund_id", apierr.CodeInvalidRefundID); err != nil {
		return req, err
	}
	amount, ok, err := amountField(raw.Amount)
	if err != nil {
		return req, err
	}
	if ok {
		req.Amount = &amount
	}
	if req.Reason, err = reasonField(raw.Reason); err != nil {
		return req, err
	}
	return req, nil
}

func (s *Service) postRefund(c echo.Context) error {
	req, err := parseRefundRequest(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), callTimeout)
	defer cancel()
	return countOutcome("refund", s.refund(ctx, req)).Write(c)
}

// refund runs the ledger path for one refund. The amount is reserved when the pending row is
// inserted, under the charge's row lock: pending and successful refunds count against the
// charge, so concurrent refunds can never add up to more than it, even before Stripe answers.
func (s *Service) refund(ctx context.Context, req refundRequest) reply {
	hash := requestHash(req)
	row, found, err := s.loadRefund(ctx, s.db, req.OrderID, req.RefundID)
	if err != nil {
		return reply{Err: err}
	}
	if !found {
		if err := s.reserveRefund(ctx, req, hash); err != nil {
			return reply{Err: err}
		}
		if row, found, err = s.loadRefund(ctx, s.db, req.OrderID, req.RefundID); err != nil {
			return reply{Err: err}
		} else if !found {
			return reply{Err: apierr.Internal(fmt.Errorf("refund row %s/%s vanished after insert", req.OrderID, req.RefundID))}
		}
	}
	if row.Livemode != s.livemode {
		return reply{Err: modeConflict("refund "+req.RefundID+" of order "+req.OrderID, row.Livemode)}
	}
	if row.RequestHash != hash {
		return reply{Err: apierr.New(apierr.CodeIdempotencyConflict,
			"refund_id %s of order %s was already used with other values; use a new refund_id for a different refund",
			req.RefundID, req.OrderID).With("order_id", req.OrderID).With("refund_id", req.RefundID)}
	}
	if row.State == stateCompleted {
		return answerOf(row.Answer, &refundBody{}, false)
	}
	return s.finishRefund(ctx, req.OrderID, req.RefundID)
}

func (s *Service) loadRefund(ctx context.Context, db *gorm.DB, orderID, refundID string) (*refundRow, bool, error) {
	var row refundRow
	res := db.WithContext(ctx).Raw(`/* all modes: refused by the caller when of the other */
		SELECT * FROM refunds WHERE order_id = $1 AND refund_id = $2`, orderID, refundID).Scan(&row)
	if res.Error != nil {
		return nil, false, database.APIError(res.Error, "load refund")
	}
	return &row, res.RowsAffected > 0, nil
}

// reservedSum is the amount of a charge held by its refunds.
type reservedSum struct {
	Reserved int64
}

// reserveRefund inserts the pending refund row after checking, under the charge's row lock, that
// the charge can be refunded by that much. A row that a concurrent request inserted while we
// waited for the lock is left alone (the caller reads it back). A pending refund is not in the
// charge's GET answer (refundedSQL counts the completed ones only), so the app is told nothing
// here: completeRefund tells.
func (s *Service) reserveRefund(ctx context.Context, req refundRequest, hash string) error {
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var ch chargeRow
		res := tx.Raw(`/* all modes: refused below when of the other */ SELECT * FROM charges WHERE order_id = $1 FOR UPDATE`, req.OrderID).Scan(&ch)
		if res.Error != nil {
			return database.APIError(res.Error, "lock charge")
		}
		if res.RowsAffected == 0 {
			return apierr.New(apierr.CodeNotFound, "no charge for order %s", req.OrderID).With("order_id", req.OrderID)
		}
		if ch.Livemode != s.livemode {
			return modeConflict("order "+req.OrderID, ch.Livemode)
		}
		if _, found, err := s.loadRefund(ctx, tx, req.OrderID, req.RefundID); err != nil {
			return err
		} else if found {
			return nil
		}
		if ch.State != stateCompleted || ch.Status == nil || *ch.Status != string(stripe.PaymentIntentStatusSucceeded) {
			status := "pending"
			if ch.Status != nil {
				status = *ch.Status
			}
			return apierr.New(apierr.CodeChargeNotRefundable, "the charge of order %s is %s, not succeeded", req.OrderID, status).
				With("order_id", req.OrderID).With("charge_status", status)
		}
		var sum reservedSum
		if err := tx.Raw(`
			SELECT COALESCE(SUM(amount), 0) AS reserved FROM refunds
			WHERE order_id = $1 AND livemode = $2 AND NOT (state = $3 AND status IN ('failed', 'canceled', $4))`,
			req.OrderID, s.livemode, stateCompleted, refundError).Scan(&sum).Error; err != nil {
			return database.APIError(err, "sum refunds")
		}
		// Stripe's amount_refunded also counts refunds made elsewhere (the Dashboard); it lacks
		// the local refunds still pending and holds the succeeded ones, so the larger of the two
		// is surely refunded or held.
		held := sum.Reserved
		if ch.AmountRefunded != nil {
			held = max(held, *ch.AmountRefunded)
		}
		remaining := ch.Amount - held
		amount := remaining
		if req.Amount != nil {
			amount = *req.Amount
		}
		if remaining <= 0 || amount > remaining {
			return apierr.New(apierr.CodeRefundExceedsCharge,
				"refund of %d exceeds the unrefunded %d of order %s", amount, max(remaining, 0), req.OrderID).
				With("order_id", req.OrderID).With("refundable_amount", max(remaining, 0))
		}
		now := s.now().UTC()
		err := tx.Exec(`
			INSERT INTO refunds (order_id, refund_id, amount, reason, request_hash, idempotency_key, livemode, state, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)`,
			req.OrderID, req.RefundID, amount, req.Reason, hash, RefundKey(req.OrderID, req.RefundID), ch.Livemode, statePending, now).Error
		if isUniqueViolation(err) {
			// The primary key cannot clash (checked under the charge lock): the key did.
			return apierr.New(apierr.CodeIdempotencyConflict,
				"refund_id %s of order %s gives the idempotency key of another refund; use another refund_id",
				req.RefundID, req.OrderID).With("order_id", req.OrderID).With("refund_id", req.RefundID)
		}
		return database.APIError(err, "insert refund")
	})
	return database.APIError(err, "reserve refund")
}

// refundOutcome is Stripe's final answer about a refund.
type refundOutcome struct {
	status         string
	stripeRefundID string
	apiErr         *apierr.Error
}

// finishRefund finishes a pending refund row through the outbound protocol.
func (s *Service) finishRefund(ctx context.Context, orderID, refundID string) reply {
	var (
		row    refundRow
		charge chargeRow
		rep    reply
	)
	complete := func(tx *gorm.DB, out refundOutcome, a outbound.Attempt) error {
		var err error
		rep, err = s.completeRefund(ctx, tx, &row, out, a.At)
		return err
	}
	res, err := outbound.Run(ctx, s.db, outbound.Call[*stripe.Refund]{
		Lock: outbound.Select{
			SQL:  `SELECT * FROM refunds WHERE order_id = $1 AND refund_id = $2 AND livemode = $3`,
			Args: []any{orderID, refundID, s.livemode},
			Into: &row,
		},
		Locked: func(tx *gorm.DB) (outbound.State, error) {
			st := outbound.State{Key: row.IdempotencyKey, CreatedAt: row.CreatedAt, Done: row.State == stateCompleted}
			if st.Done {
				return st, nil
			}
			if err := tx.Raw(`SELECT payment_intent_id FROM charges WHERE order_id = $1 AND livemode = $2`, orderID, s.livemode).Scan(&charge).Error; err != nil {
				return st, fmt.Errorf("load payment intent of refund: %w", err)
			}
			if charge.PaymentIntentID == nil || *charge.PaymentIntentID == "" {
				// Only succeeded charges get refund rows, and those always have a PaymentIntent.
				return st, apierr.Internal(fmt.Errorf("charge of order %q has no payment intent", orderID))
			}
			return st, nil
		},
		Find: func(ctx context.Context) (*stripe.Refund, bool, error) {
			return s.findRefund(ctx, &row, *charge.PaymentIntentID)
		},
		Create: func(p stripe.Params) (*stripe.Refund, error) {
			return s.stripe.Refunds.New(&stripe.RefundParams{
				Params:        p,
				PaymentIntent: charge.PaymentIntentID,
				Amount:        stripe.Int64(row.Amount),
				Reason:        row.Reason,
				Metadata:      map[string]string{"order_id": row.OrderID, "refund_id": row.RefundID},
			})
		},
		Complete: func(tx *gorm.DB, r *stripe.Refund, a outbound.Attempt) error {
			return complete(tx, refundOutcome{status: string(r.Status), stripeRefundID: r.ID}, a)
		},
		Refuse: func(tx *gorm.DB, a outbound.Attempt) error {
			var se *stripe.Error
			if !errors.As(a.Err, &se) {
				return apierr.Internal(fmt.Errorf("refund refusal without a Stripe error: %w", stripeclient.Redact(a.Err)))
			}
			return complete(tx, refundOutcome{status: refundError, apiErr: refused(a.Err, apierr.CodeRefundFailed,
				"Stripe refused the refund: %s", se.Msg).With("stripe_code", string(se.Code))}, a)
		},
		RecordAttempt: func(tx *gorm.DB, a outbound.Attempt) error {
			apiErr := unfinished(a, "refund")
			if err := tx.Exec(`
				UPDATE refunds SET attempts = attempts + 1, last_attempt_at = $1, error_code = $2, updated_at = $1
				WHERE order_id = $3 AND refund_id = $4 AND livemode = $5`, a.At, string(apiErr.Code), orderID, refundID, s.livemode).Error; err != nil {
				return fmt.Errorf("record refund attempt: %w", err)
			}
			rep = reply{Err: apiErr}
			return nil
		},
		Now: s.now,
		Log: s.log.With("order_id", orderID, "refund_id", refundID),
	})
	if err != nil {
		return reply{Err: database.APIError(err, "finish refund")}
	}
	switch res.Outcome {
	case outbound.AlreadyDone:
		return answerOf(row.Answer, &refundBody{}, false)
	case outbound.Gone:
		return reply{Err: apierr.Internal(fmt.Errorf("refund row %s/%s vanished", orderID, refundID))}
	}
	return rep
}

// completeRefund records Stripe's final answer in the locked row and answers it.
func (s *Service) completeRefund(ctx context.Context, tx *gorm.DB, row *refundRow, out refundOutcome, at time.Time) (reply, error) {
	var body any
	var errorCode *string
	if out.apiErr == nil {
		body = refundBody{
			RefundID: row.RefundID, OrderID: row.OrderID, Status: out.status, StripeRefundID: out.stripeRefundID,
			Amount: row.Amount, IdempotencyKey: row.IdempotencyKey,
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
		UPDATE refunds SET state = $1,
			status = CASE WHEN re_event_created IS NULL OR CAST($2 AS text) IN `+refundFinalSQL+` THEN CAST($2 AS text) ELSE status END,
			stripe_refund_id = coalesce(NULLIF($3, ''), stripe_refund_id), answer = CAST($4 AS jsonb),
			error_code = $5, attempts = attempts + 1, last_attempt_at = $6, completed_at = $6, updated_at = $6
		WHERE order_id = $7 AND refund_id = $8 AND livemode = $9`,
		stateCompleted, out.status, out.stripeRefundID, answer, errorCode, at, row.OrderID, row.RefundID, row.Livemode).Error; err != nil {
		return reply{}, fmt.Errorf("complete refund: %w", err)
	}
	// A refund Stripe accepted counts in the charge's amount_refunded from now on.
	if err := s.tellCharge(ctx, tx, row.OrderID, "", row.Livemode); err != nil {
		return reply{}, err
	}
	s.log.InfoContext(ctx, "refund completed", "order_id", row.OrderID, "refund_id", row.RefundID,
		"status", out.status, "stripe_refund_id", out.stripeRefundID, "amount", row.Amount)
	return answerOf(&answer, &refundBody{}, true), nil
}

// findRefund looks up the refund made by an earlier attempt among the PaymentIntent's refunds
// (a list, so unlike search it is never stale).
func (s *Service) findRefund(ctx context.Context, row *refundRow, paymentIntentID string) (*stripe.Refund, bool, error) {
	params := &stripe.RefundListParams{PaymentIntent: stripe.String(paymentIntentID)}
	params.Context = ctx
	it := s.stripe.Refunds.List(params)
	for it.Next() {
		if r := it.Refund(); r.Metadata["order_id"] == row.OrderID && r.Metadata["refund_id"] == row.RefundID {
			return r, true, nil
		}
	}
	if err := it.Err(); err != nil {
		return nil, false, fmt.Errorf("list refunds of %s: %w", paymentIntentID, err)
	}
	return nil, false, nil
}
