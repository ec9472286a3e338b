package ledger

import (
	"context"
	"fmt"
	"time"
)

// ChargeRow is one ledger row of a customer, with what has been refunded of it, for the admin
// console.
type ChargeRow struct {
	OrderID         string    `gorm:"column:order_id"`
	UserID          string    `gorm:"column:user_id"`
	Amount          int64     `gorm:"column:amount"`
	Currency        string    `gorm:"column:currency"`
	State           string    `gorm:"column:state"`
	Status          *string   `gorm:"column:status"`
	PaymentIntentID *string   `gorm:"column:payment_intent_id"`
	DeclineCode     *string   `gorm:"column:decline_code"`
	Refunded        int64     `gorm:"column:refunded"`
	CreatedAt       time.Time `gorm:"column:created_at"`
}

// CustomerCharges lists the ledger rows of a Stripe customer of one mode, newest first. Refunds
// count once completed and not failed or canceled.
func (s *Service) CustomerCharges(ctx context.Context, stripeCustomerID string, livemode bool, limit int) ([]ChargeRow, error) {
	out := []ChargeRow{}
	err := s.db.WithContext(ctx).Raw(`
		SELECT c.order_id, c.user_id, c.amount, c.currency, c.state, c.status, c.payment_intent_id, c.decline_code, c.created_at,
		       coalesce((SELECT sum(r.amount) FROM refunds r
		                 WHERE r.order_id = c.order_id AND r.livemode = c.livemode
		                   AND r.state = 'completed' AND r.status NOT IN ('failed', 'canceled')), 0) AS refunded
		FROM charges c
		WHERE c.stripe_customer_id = $1 AND c.livemode = $2
		ORDER BY c.created_at DESC, c.order_id DESC LIMIT $3`, stripeCustomerID, livemode, limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list charges of %s: %w", stripeCustomerID, err)
	}
	return out, nil
}
