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
	"billing/internal/stripeclient"
)

// refundError is the ledger status of a refund that Stripe refused (422 refund_failed).
const refundError = "error"

// RefundKey is the Stripe idempotency key of a refund. The contract fixes this format; since ids
// may contain '-', two (order, refund) pairs can spell the same key, which the UNIQUE
// refunds.idempotency_key turns into a 409 instead of a Stripe-side clash.
func RefundKey(orderID, refundID string) string { return "refund-" + orderID + "-" + refundID }

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
	return s.refund(ctx, req).write(c)
}

// refund runs the ledger path for one refund. The amount is reserved when the pending row is
// inserted, under the charge's row lock: pending and successful refunds count against the
// charge, so concurrent refunds can never add up to more than it, even before Stripe answers.
func (s *Service) refund(ctx context.Context, req refundRequest) reply {
	hash := requestHash(req)
	row, found, err := s.loadRefund(ctx, s.db, req.OrderID, req.RefundID, false)
	if err != nil {
		return reply{err: err}
	}
	if !found {
		if err := s.reserveRefund(ctx, req, hash); err != nil {
			return reply{err: err}
		}
		if row, found, err = s.loadRefund(ctx, s.db, req.OrderID, req.RefundID, false); err != nil {
			return reply{err: err}
		} else if !found {
			return reply{err: apierr.Internal(fmt.Errorf("refund row %s/%s vanished after insert", req.OrderID, req.RefundID))}
		}
	}
	if row.Livemode != s.livemode {
		return reply{err: modeConflict("refund "+req.RefundID+" of order "+req.OrderID, row.Livemode)}
	}
	if row.RequestHash != hash {
		return reply{err: apierr.New(apierr.CodeIdempotencyConflict,
			"refund_id %s of order %s was already used with other values; use a new refund_id for a different refund",
			req.RefundID, req.OrderID).With("order_id", req.OrderID).With("refund_id", req.RefundID)}
	}
	if row.State == stateCompleted {
		return answerOf(row.Answer, &refundBody{}, false)
	}
	return s.finishRefund(ctx, req.OrderID, req.RefundID)
}

func (s *Service) loadRefund(ctx context.Context, db *gorm.DB, orderID, refundID string, lock bool) (*refundRow, bool, error) {
	q := `SELECT * FROM refunds WHERE order_id = ? AND refund_id = ?`
	if lock {
		q += ` FOR UPDATE`
	}
	var row refundRow
	res := db.WithContext(ctx).Raw(q, orderID, refundID).Scan(&row)
	if res.Error != nil {
		return nil, false, database.APIError(res.Error, "load refund")
	}
	return &row, res.RowsAffected > 0, nil
}

// reserveRefund inserts the pending refund row after checking, under the charge's row lock, that
// the charge can be refunded by that much. A row that a concurrent request inserted while we
// waited for the lock is left alone (the caller reads it back).
func (s *Service) reserveRefund(ctx context.Context, req refundRequest, hash string) error {
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var ch chargeRow
		res := tx.Raw(`SELECT * FROM charges WHERE order_id = ? FOR UPDATE`, req.OrderID).Scan(&ch)
		if res.Error != nil {
			return database.APIError(res.Error, "lock charge")
		}
		if res.RowsAffected == 0 {
			return apierr.New(apierr.CodeNotFound, "no charge for order %s", req.OrderID).With("order_id", req.OrderID)
		}
		if ch.Livemode != s.livemode {
			return modeConflict("order "+req.OrderID, ch.Livemode)
		}
		if _, found, err := s.loadRefund(ctx, tx, req.OrderID, req.RefundID, false); err != nil {
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
		var reserved int64
		if err := tx.Raw(`
			SELECT COALESCE(SUM(amount), 0) FROM refunds
			WHERE order_id = ? AND NOT (state = ? AND status IN ('failed', 'canceled', ?))`,
			req.OrderID, stateCompleted, refundError).Scan(&reserved).Error; err != nil {
			return database.APIError(err, "sum refunds")
		}
		remaining := ch.Amount - reserved
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
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			req.OrderID, req.RefundID, amount, req.Reason, hash, RefundKey(req.OrderID, req.RefundID), ch.Livemode, statePending, now, now).Error
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

type refundOutcome struct {
	final          bool
	status         string
	stripeRefundID string
	apiErr         *apierr.Error
}

// finishRefund completes a pending refund row under its lock.
func (s *Service) finishRefund(ctx context.Context, orderID, refundID string) reply {
	var rep reply
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		row, found, err := s.loadRefund(ctx, tx, orderID, refundID, true)
		if err != nil {
			return err
		}
		if !found {
			return apierr.Internal(fmt.Errorf("refund row %s/%s vanished", orderID, refundID))
		}
		if row.State == stateCompleted {
			rep = answerOf(row.Answer, &refundBody{}, false)
			return nil
		}
		var piID string
		if err := tx.Raw(`SELECT COALESCE(payment_intent_id, '') FROM charges WHERE order_id = ?`, orderID).
			Scan(&piID).Error; err != nil {
			return database.APIError(err, "load payment intent of refund")
		}
		out := s.attemptRefund(ctx, row, piID)
		now := s.now().UTC()
		if !out.final {
			if err := tx.Exec(`
				UPDATE refunds SET attempts = attempts + 1, last_attempt_at = ?, error_code = ?, updated_at = ?
				WHERE order_id = ? AND refund_id = ?`, now, string(out.apiErr.Code), now, orderID, refundID).Error; err != nil {
				return database.APIError(err, "record refund attempt")
			}
			rep = reply{err: out.apiErr}
			return nil
		}
		var body any
		var errorCode *string
		if out.apiErr == nil {
			body = refundBody{
				RefundID: refundID, OrderID: orderID, Status: out.status, StripeRefundID: out.stripeRefundID,
				Amount: row.Amount, IdempotencyKey: row.IdempotencyKey,
			}
		} else {
			code := string(out.apiErr.Code)
			errorCode = &code
		}
		answer, err := encodeAnswer(body, out.apiErr)
		if err != nil {
			return apierr.Internal(err)
		}
		if err := tx.Exec(`
			UPDATE refunds SET state = ?, status = ?, stripe_refund_id = NULLIF(?, ''), answer = CAST(? AS jsonb),
				error_code = ?, attempts = attempts + 1, last_attempt_at = ?, completed_at = ?, updated_at = ?
			WHERE order_id = ? AND refund_id = ?`,
			stateCompleted, out.status, out.stripeRefundID, answer, errorCode, now, now, now, orderID, refundID).Error; err != nil {
			return database.APIError(err, "complete refund")
		}
		s.log.InfoContext(ctx, "refund completed", "order_id", orderID, "refund_id", refundID,
			"status", out.status, "stripe_refund_id", out.stripeRefundID, "amount", row.Amount)
		rep = answerOf(&answer, &refundBody{}, true)
		return nil
	})
	if err != nil {
		return reply{err: database.APIError(err, "finish refund")}
	}
	return rep
}

func (s *Service) attemptRefund(ctx context.Context, row *refundRow, paymentIntentID string) refundOutcome {
	if paymentIntentID == "" {
		// Only succeeded charges get refund rows, and those always have a PaymentIntent.
		return refundOutcome{apiErr: apierr.Internal(fmt.Errorf("charge of order %q has no payment intent", row.OrderID))}
	}
	if s.now().Sub(row.CreatedAt) >= keyWindow {
		r, err := s.findRefund(ctx, row, paymentIntentID)
		if err != nil {
			return refundOutcome{apiErr: lookupFailed(err, "refund")}
		}
		if r != nil {
			s.log.InfoContext(ctx, "refund of an old pending row found on Stripe",
				"order_id", row.OrderID, "refund_id", row.RefundID, "stripe_refund_id", r.ID)
			return refundOutcome{final: true, status: string(r.Status), stripeRefundID: r.ID}
		}
	}
	params := &stripe.RefundParams{
		PaymentIntent: stripe.String(paymentIntentID),
		Amount:        stripe.Int64(row.Amount),
		Reason:        row.Reason,
		Metadata:      map[string]string{"order_id": row.OrderID, "refund_id": row.RefundID},
	}
	params.Context = ctx
	params.SetIdempotencyKey(row.IdempotencyKey)
	r, err := s.stripe.Refunds.New(params)
	if err == nil {
		return refundOutcome{final: true, status: string(r.Status), stripeRefundID: r.ID}
	}
	s.log.WarnContext(ctx, "refund attempt failed", "order_id", row.OrderID, "refund_id", row.RefundID, stripeclient.LogAttr(err))
	var se *stripe.Error
	switch {
	case stripeclient.Retryable(err) || !errors.As(err, &se):
		return refundOutcome{apiErr: unavailable(err, "refund")}
	case stripeMisconfigured(se):
		return refundOutcome{apiErr: refused(err, apierr.CodeStripeError, "Stripe refused the call; the refund stays pending")}
	default:
		return refundOutcome{final: true, status: refundError, apiErr: refused(err, apierr.CodeRefundFailed,
			"Stripe refused the refund: %s", se.Msg).With("stripe_code", string(se.Code))}
	}
}

// findRefund looks up the refund made by an earlier attempt among the PaymentIntent's refunds
// (a list, so unlike search it is never stale).
func (s *Service) findRefund(ctx context.Context, row *refundRow, paymentIntentID string) (*stripe.Refund, error) {
	params := &stripe.RefundListParams{PaymentIntent: stripe.String(paymentIntentID)}
	params.Context = ctx
	it := s.stripe.Refunds.List(params)
	for it.Next() {
		if r := it.Refund(); r.Metadata["order_id"] == row.OrderID && r.Metadata["refund_id"] == row.RefundID {
			return r, nil
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list refunds of %s: %w", paymentIntentID, err)
	}
	return nil, nil
}
