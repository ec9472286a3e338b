package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"gorm.io/gorm"

	"billing/webhooks"
)

// Settling by events. A charge or refund can end its request non-final — a PaymentIntent that
// requires_action or is processing, a refund that is pending — and Stripe tells the rest by
// events. These handlers write the truth into the row's status (the stored answer stays what
// POST answered, so a repeat of the request still gets the same body) in the event's transaction.
//
// Matching: a charge by its payment_intent_id, or, while the row has none yet (the request is
// still completing it), by the PaymentIntent's metadata order_id and customer; a refund by its
// stripe_refund_id, or by metadata order_id and refund_id. A PaymentIntent or refund that is not
// ours (an invoice's, one made in the dashboard) matches nothing and is acknowledged. Only rows of
// the event's own mode are matched: an event signed with one mode's secret never settles a row of
// the other.
//
// Ordering: the status is written only when the event's key (created, rank, event id) is above
// the one stored with the row (pi_event_* for charges, re_event_* for refunds), so an older event
// never overwrites a newer state; the rank orders the statuses of one second along their
// lifecycle. Final states are never left: succeeded and canceled for a PaymentIntent, failed and
// canceled for a refund (a succeeded refund can still fail).
//
// The app is told (charge.updated, tellCharge) in the event's transaction when an event changed
// a charge's GET answer: after the ledger rows are written and locked, so that the user's lock
// is always taken last.

// Event types the ledger handles, as stripe-go v79 spells them (EventType constants). v79 knows
// no refund.failed: a failed refund arrives as refund.updated / charge.refund.updated.
const (
	EventPaymentIntentSucceeded     = "payment_intent.succeeded"
	EventPaymentIntentPaymentFailed = "payment_intent.payment_failed"
	EventPaymentIntentCanceled      = "payment_intent.canceled"
	EventPaymentIntentProcessing    = "payment_intent.processing"
	EventChargeRefunded             = "charge.refunded"
	EventChargeRefundUpdated        = "charge.refund.updated"
	EventRefundCreated              = "refund.created"
	EventRefundUpdated              = "refund.updated"
)

// Register registers the ledger's event handlers.
func (s *Service) Register(reg *webhooks.Registry) {
	pi := webhooks.HandlerFunc(s.handlePaymentIntentEvent)
	for _, typ := range []string{EventPaymentIntentSucceeded, EventPaymentIntentPaymentFailed, EventPaymentIntentCanceled, EventPaymentIntentProcessing} {
		reg.Register(typ, pi)
	}
	re := webhooks.HandlerFunc(s.handleRefundEvent)
	reg.Register(EventChargeRefundUpdated, re)
	reg.Register(EventRefundCreated, re)
	reg.Register(EventRefundUpdated, re)
	reg.Register(EventChargeRefunded, webhooks.HandlerFunc(s.handleChargeRefunded))
}

// Final statuses, in SQL lists too.
const (
	chargeFinalSQL = `('succeeded', 'canceled')`
	refundFinalSQL = `('failed', 'canceled')`
)

// chargeStatusRank orders a PaymentIntent's statuses (as the ledger names them) along its
// lifecycle, for ties within one second.
func chargeStatusRank(status string) int {
	switch status {
	case "processing":
		return 1
	case "requires_action":
		return 2
	case chargeDeclined:
		return 3
	case "succeeded", "canceled":
		return 4
	}
	return 0
}

// refundStatusRank does the same for refunds.
func refundStatusRank(status string) int {
	switch status {
	case "pending":
		return 1
	case "requires_action":
		return 2
	case "succeeded":
		return 3
	case "failed", "canceled":
		return 4
	}
	return 0
}

type paymentIntentObject struct {
	ID       string            `json:"id"`
	Status   string            `json:"status"`
	Customer json.RawMessage   `json:"customer"`
	Metadata map[string]string `json:"metadata"`
	// LastPaymentError says why the payment failed.
	LastPaymentError *struct {
		Code        string `json:"code"`
		DeclineCode string `json:"decline_code"`
	} `json:"last_payment_error"`
}

type refundObject struct {
	ID            string            `json:"id"`
	Status        string            `json:"status"`
	Metadata      map[string]string `json:"metadata"`
	FailureReason *string           `json:"failure_reason"`
}

type chargeObject struct {
	ID             string          `json:"id"`
	PaymentIntent  json.RawMessage `json:"payment_intent"`
	AmountRefunded *int64          `json:"amount_refunded"`
	// Refunds is only there when the payload carries it (older API versions, or expanded).
	Refunds *struct {
		Data []json.RawMessage `json:"data"`
	} `json:"refunds"`
}

func decodeObject(raw json.RawMessage, v any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return errors.New("data.object is not a JSON object")
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decode data.object: %w", err)
	}
	return nil
}

// refID reads a Stripe reference: an id string or an expanded object's id; "" for null.
func refID(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	var id string
	if json.Unmarshal(raw, &id) == nil {
		return id
	}
	var obj struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.ID
	}
	return ""
}

func permanent(ev webhooks.Event, err error) error {
	return webhooks.Permanent(fmt.Errorf("%s %s: %w", ev.Type, ev.ID, err))
}

func mismatch(ev webhooks.Event, what string, rowLive bool) error {
	return webhooks.PermanentReason(webhooks.FailureLivemodeMismatch,
		fmt.Errorf("%s is a %s-mode row; the event %s is %s-mode", what, modeName(rowLive), ev.ID, modeName(ev.Livemode)))
}

func modeName(livemode bool) string {
	if livemode {
		return "live"
	}
	return "test"
}

// chargeStatusOf maps a PaymentIntent event to the ledger's status of the charge.
func chargeStatusOf(eventType, piStatus string) string {
	switch eventType {
	case EventPaymentIntentSucceeded:
		return "succeeded"
	case EventPaymentIntentProcessing:
		return "processing"
	case EventPaymentIntentCanceled:
		return "canceled"
	case EventPaymentIntentPaymentFailed:
		// requires_payment_method after an attempt: what POST answers as a decline.
		return chargeDeclined
	}
	return piStatus
}

type matchedRow struct {
	OrderID          string  `gorm:"column:order_id"`
	UserID           string  `gorm:"column:user_id"`
	RefundID         string  `gorm:"column:refund_id"`
	Livemode         bool    `gorm:"column:livemode"`
	StripeCustomerID string  `gorm:"column:stripe_customer_id"`
	PaymentIntentID  *string `gorm:"column:payment_intent_id"`
}

func (s *Service) handlePaymentIntentEvent(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	var pi paymentIntentObject
	if err := decodeObject(ev.Object, &pi); err != nil {
		return permanent(ev, err)
	}
	if pi.ID == "" {
		return permanent(ev, errors.New("payment intent has no id"))
	}
	var rows []matchedRow
	if err := tx.WithContext(ctx).Raw(`
		SELECT order_id, user_id, livemode, stripe_customer_id, payment_intent_id FROM charges
		WHERE livemode = $3 AND (payment_intent_id = $1 OR (payment_intent_id IS NULL AND order_id = $2))
		ORDER BY payment_intent_id IS NULL, order_id
		`+webhooks.LockRows(ctx), pi.ID, pi.Metadata["order_id"], ev.Livemode).Scan(&rows).Error; err != nil {
		return fmt.Errorf("lock charge of %s: %w", pi.ID, err)
	}
	if len(rows) == 0 {
		s.log.DebugContext(ctx, "payment intent of no charge of ours", "event_id", ev.ID, "payment_intent_id", pi.ID)
		return nil
	}
	row := rows[0]
	if row.Livemode != ev.Livemode {
		return mismatch(ev, "the charge of order "+row.OrderID, row.Livemode)
	}
	if row.PaymentIntentID == nil && refID(pi.Customer) != row.StripeCustomerID {
		// Same order id in the metadata, another customer: not the PaymentIntent of this row.
		s.log.WarnContext(ctx, "payment intent names an order of another customer; ignored",
			"event_id", ev.ID, "payment_intent_id", pi.ID, "order_id", row.OrderID)
		return nil
	}
	status := chargeStatusOf(ev.Type, pi.Status)
	declineCode := ""
	if status == chargeDeclined && pi.LastPaymentError != nil {
		declineCode = pi.LastPaymentError.DeclineCode
		if declineCode == "" {
			declineCode = pi.LastPaymentError.Code
		}
	}
	res := tx.WithContext(ctx).Exec(`
		UPDATE charges SET status = $3, payment_intent_id = coalesce(payment_intent_id, $4),
		  decline_code = CASE WHEN $3 = 'declined' THEN NULLIF($5, '') ELSE decline_code END,
		  pi_event_id = $6, pi_event_created = $7, pi_event_rank = $8, updated_at = $9
		WHERE order_id = $1 AND livemode = $2
		  AND (pi_event_created IS NULL
		       OR (pi_event_created, pi_event_rank, pi_event_id COLLATE "C")
		          < (CAST($7 AS timestamptz), CAST($8 AS integer), CAST($6 AS text) COLLATE "C"))
		  AND (status IS NULL OR status NOT IN `+chargeFinalSQL+` OR status = $3)`,
		row.OrderID, ev.Livemode, status, pi.ID, declineCode, ev.ID, ev.Created.UTC(), chargeStatusRank(status), s.now().UTC())
	if res.Error != nil {
		return fmt.Errorf("settle charge of order %s: %w", row.OrderID, res.Error)
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "charge settled by event", slog.String("event_id", ev.ID),
		slog.String("order_id", row.OrderID), slog.String("status", status), slog.Bool("applied", res.RowsAffected == 1))
	if res.RowsAffected == 0 {
		return nil
	}
	return s.tellCharge(ctx, tx, row.OrderID, row.UserID, ev.Livemode)
}

func (s *Service) handleRefundEvent(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	var r refundObject
	if err := decodeObject(ev.Object, &r); err != nil {
		return permanent(ev, err)
	}
	if r.ID == "" || r.Status == "" {
		return permanent(ev, errors.New("refund without id or status"))
	}
	orderID, err := s.settleRefund(ctx, tx, ev, &r)
	if err != nil || orderID == "" {
		return err
	}
	return s.tellCharge(ctx, tx, orderID, "", ev.Livemode)
}

// settleRefund writes the event's status of a refund into its row; orderID is the refund's
// charge when the row took it ("" when nothing changed), for the caller to tell.
func (s *Service) settleRefund(ctx context.Context, tx *gorm.DB, ev webhooks.Event, r *refundObject) (orderID string, err error) {
	var rows []matchedRow
	if err := tx.WithContext(ctx).Raw(`
		SELECT order_id, refund_id, livemode FROM refunds
		WHERE livemode = $4 AND (stripe_refund_id = $1 OR (stripe_refund_id IS NULL AND order_id = $2 AND refund_id = $3))
		ORDER BY stripe_refund_id IS NULL, order_id, refund_id
		`+webhooks.LockRows(ctx), r.ID, r.Metadata["order_id"], r.Metadata["refund_id"], ev.Livemode).Scan(&rows).Error; err != nil {
		return "", fmt.Errorf("lock refund %s: %w", r.ID, err)
	}
	if len(rows) == 0 {
		s.log.DebugContext(ctx, "refund of no ledger row", "event_id", ev.ID, "stripe_refund_id", r.ID)
		return "", nil
	}
	row := rows[0]
	if row.Livemode != ev.Livemode {
		return "", mismatch(ev, "refund "+row.RefundID+" of order "+row.OrderID, row.Livemode)
	}
	res := tx.WithContext(ctx).Exec(`
		UPDATE refunds SET status = $4, stripe_refund_id = coalesce(stripe_refund_id, $5), failure_reason = $6,
		  re_event_id = $7, re_event_created = $8, re_event_rank = $9, updated_at = $10
		WHERE order_id = $1 AND refund_id = $2 AND livemode = $3
		  AND (re_event_created IS NULL
		       OR (re_event_created, re_event_rank, re_event_id COLLATE "C")
		          < (CAST($8 AS timestamptz), CAST($9 AS integer), CAST($7 AS text) COLLATE "C"))
		  AND (status IS NULL OR status NOT IN `+refundFinalSQL+` OR status = $4)`,
		row.OrderID, row.RefundID, ev.Livemode, r.Status, r.ID, r.FailureReason,
		ev.ID, ev.Created.UTC(), refundStatusRank(r.Status)*10+refundTypeRank(ev.Type), s.now().UTC())
	if res.Error != nil {
		return "", fmt.Errorf("settle refund %s of order %s: %w", row.RefundID, row.OrderID, res.Error)
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "refund settled by event", slog.String("event_id", ev.ID),
		slog.String("order_id", row.OrderID), slog.String("refund_id", row.RefundID),
		slog.String("status", r.Status), slog.Bool("applied", res.RowsAffected == 1))
	if res.RowsAffected == 0 {
		return "", nil
	}
	return row.OrderID, nil
}

// refundTypeRank: within one second and one status, an update outranks the creation.
func refundTypeRank(eventType string) int {
	if eventType == EventRefundCreated {
		return 0
	}
	return 1
}

// handleChargeRefunded records how much of a charge Stripe has refunded (also refunds made
// elsewhere), and settles the refunds the payload lists. The charges it changed are told once
// each, at the end: after the refunds' row locks, so that the user's lock comes last.
func (s *Service) handleChargeRefunded(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	var ch chargeObject
	if err := decodeObject(ev.Object, &ch); err != nil {
		return permanent(ev, err)
	}
	piID := refID(ch.PaymentIntent)
	if ch.ID == "" {
		return permanent(ev, errors.New("charge has no id"))
	}
	// The charges to tell, each once, in the order they changed (user id "" to look it up).
	var told []matchedRow
	tell := func(orderID, userID string) {
		for _, t := range told {
			if t.OrderID == orderID {
				return
			}
		}
		told = append(told, matchedRow{OrderID: orderID, UserID: userID})
	}
	if piID != "" {
		var rows []matchedRow
		if err := tx.WithContext(ctx).Raw(`SELECT order_id, user_id, livemode FROM charges WHERE payment_intent_id = $1 AND livemode = $2 ORDER BY order_id `+webhooks.LockRows(ctx), piID, ev.Livemode).
			Scan(&rows).Error; err != nil {
			return fmt.Errorf("lock charge of %s: %w", piID, err)
		}
		if len(rows) > 0 {
			if rows[0].Livemode != ev.Livemode {
				return mismatch(ev, "the charge of order "+rows[0].OrderID, rows[0].Livemode)
			}
			// The refunded amount only grows: the largest seen is the newest.
			if ch.AmountRefunded != nil {
				if err := tx.WithContext(ctx).Exec(`
					UPDATE charges SET amount_refunded = GREATEST(coalesce(amount_refunded, 0), $2), updated_at = $3
					WHERE order_id = $1 AND livemode = $4`, rows[0].OrderID, *ch.AmountRefunded, s.now().UTC(), ev.Livemode).Error; err != nil {
					return fmt.Errorf("record refunded amount of order %s: %w", rows[0].OrderID, err)
				}
				tell(rows[0].OrderID, rows[0].UserID)
			}
		}
	}
	if ch.Refunds != nil {
		for _, raw := range ch.Refunds.Data {
			var r refundObject
			if err := decodeObject(raw, &r); err != nil || r.ID == "" || r.Status == "" {
				continue
			}
			orderID, err := s.settleRefund(ctx, tx, ev, &r)
			if err != nil {
				return err
			}
			if orderID != "" {
				tell(orderID, "")
			}
		}
	}
	for _, t := range told {
		if err := s.tellCharge(ctx, tx, t.OrderID, t.UserID, ev.Livemode); err != nil {
			return err
		}
	}
	return nil
}
