package ledger

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The reads of the admin console: the charges page (filters, search, keyset paging), one charge
// with its refunds, a user's charges and refunds on the customer page, and the ids the find box
// leads to a charge from.

// ChargeRow is one ledger row, with what has been refunded of it, for the admin console.
type ChargeRow struct {
	OrderID          string    `gorm:"column:order_id"`
	UserID           string    `gorm:"column:user_id"`
	StripeCustomerID string    `gorm:"column:stripe_customer_id"`
	Livemode         bool      `gorm:"column:livemode"`
	Amount           int64     `gorm:"column:amount"`
	Currency         string    `gorm:"column:currency"`
	Description      *string   `gorm:"column:description"`
	State            string    `gorm:"column:state"`
	Status           *string   `gorm:"column:status"`
	PaymentIntentID  *string   `gorm:"column:payment_intent_id"`
	ErrorCode        *string   `gorm:"column:error_code"`
	DeclineCode      *string   `gorm:"column:decline_code"`
	Attempts         int       `gorm:"column:attempts"`
	Refunded         int64     `gorm:"column:refunded"`
	CreatedAt        time.Time `gorm:"column:created_at"`
}

// refundedSQL is what has been refunded of the charge c, the same on every read (the API's
// amount_refunded, the console): the larger of Stripe's figure, which also counts refunds made
// elsewhere (the Dashboard) but comes only with charge.refunded events that may lag or never come,
// and the local refunds Stripe accepted (completed, and not failed, canceled or refused).
const refundedSQL = `GREATEST(coalesce(c.amount_refunded, 0), coalesce((SELECT sum(r.amount) FROM refunds r
	WHERE r.order_id = c.order_id AND r.livemode = c.livemode
	  AND r.state = 'completed' AND r.status NOT IN ('failed', 'canceled', '` + refundError + `')), 0)) /* all modes: its charge's, which the statement binds */`

// chargeFrom selects ChargeRows of charges c of the mode $1; a statement goes on with AND.
const chargeFrom = `SELECT c.order_id, c.user_id, c.stripe_customer_id, c.livemode, c.amount, c.currency, c.description,
	c.state, c.status, c.payment_intent_id, c.error_code, c.decline_code, c.attempts, c.created_at,
	` + refundedSQL + ` AS refunded
	FROM charges c WHERE c.livemode = $1`

// CustomerCharges lists the ledger rows of a Stripe customer of one mode, newest first.
func (s *Service) CustomerCharges(ctx context.Context, stripeCustomerID string, livemode bool, limit int) ([]ChargeRow, error) {
	out := []ChargeRow{}
	err := s.db.WithContext(ctx).Raw(chargeFrom+` AND c.stripe_customer_id = $2
		ORDER BY c.created_at DESC, c.order_id DESC LIMIT $3`, livemode, stripeCustomerID, limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list charges of %s: %w", stripeCustomerID, err)
	}
	return out, nil
}

// ChargeCursor is a position in the charges list, newest first: (created_at, order_id).
type ChargeCursor struct {
	CreatedAt time.Time
	OrderID   string
}

// String is the cursor as a URL parameter.
func (c ChargeCursor) String() string {
	return c.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + c.OrderID
}

// ParseChargeCursor reads ChargeCursor.String.
func ParseChargeCursor(s string) (ChargeCursor, error) {
	ts, id, ok := strings.Cut(s, "|")
	if !ok {
		return ChargeCursor{}, fmt.Errorf("cursor is not TIME|ORDER_ID")
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return ChargeCursor{}, fmt.Errorf("cursor time: %w", err)
	}
	return ChargeCursor{CreatedAt: t, OrderID: id}, nil
}

// StatusPending filters the charges still waiting for Stripe's final answer (state pending).
const StatusPending = "pending"

// ChargeQuery selects a page of the charges of one mode. Zero fields do not filter.
type ChargeQuery struct {
	Livemode bool
	// Status is Stripe's status of the PaymentIntent (succeeded, processing, …), the ledger's
	// own (declined, failed, error), or StatusPending.
	Status string
	// CreatedFrom (inclusive) and CreatedTo (exclusive) bound created_at.
	CreatedFrom, CreatedTo time.Time
	// Search is an order id, a user id or a PaymentIntent id, exactly.
	Search string
	// Before pages to older rows, After to newer ones; at most one is set.
	Before, After *ChargeCursor
	Limit         int
}

// ChargePage is a page of charges, newest first.
type ChargePage struct {
	Charges            []ChargeRow
	HasOlder, HasNewer bool
}

// SearchCharges reads a page of charges, keyset-paged on (created_at, order_id) in the order of
// charges_mode_created_idx (or charges_mode_status_created_idx with a status), so that a page
// costs the same however deep it is.
func (s *Service) SearchCharges(ctx context.Context, q ChargeQuery) (*ChargePage, error) {
	if q.Limit < 1 {
		q.Limit = 50
	}
	args := []any{q.Livemode}
	var where []string
	add := func(cond string, vs ...any) {
		for _, v := range vs {
			args = append(args, v)
			cond = strings.Replace(cond, "$?", "$"+strconv.Itoa(len(args)), 1)
		}
		where = append(where, cond)
	}
	switch q.Status {
	case "":
	case StatusPending:
		where = append(where, `c.state = 'pending'`)
	default:
		add(`c.status = $?`, q.Status)
	}
	if !q.CreatedFrom.IsZero() {
		add(`c.created_at >= $?`, q.CreatedFrom)
	}
	if !q.CreatedTo.IsZero() {
		add(`c.created_at < $?`, q.CreatedTo)
	}
	if q.Search != "" {
		add(`(c.order_id = $? OR c.user_id = $? OR c.payment_intent_id = $?)`, q.Search, q.Search, q.Search)
	}
	order := `DESC`
	switch {
	case q.Before != nil:
		add(`(c.created_at, c.order_id) < ($?, $?)`, q.Before.CreatedAt, q.Before.OrderID)
	case q.After != nil:
		add(`(c.created_at, c.order_id) > ($?, $?)`, q.After.CreatedAt, q.After.OrderID)
		order = `ASC`
	}
	args = append(args, q.Limit+1)
	rows := []ChargeRow{}
	sql := chargeFrom
	for _, w := range where {
		sql += ` AND ` + w
	}
	err := s.db.WithContext(ctx).Raw(sql+
		` ORDER BY c.created_at `+order+`, c.order_id `+order+` LIMIT $`+strconv.Itoa(len(args)), args...).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("search charges: %w", err)
	}
	more := len(rows) > q.Limit
	if more {
		rows = rows[:q.Limit]
	}
	p := &ChargePage{Charges: rows}
	switch {
	case q.After != nil:
		slices.Reverse(p.Charges)
		p.HasNewer, p.HasOlder = more, true
	case q.Before != nil:
		p.HasOlder, p.HasNewer = more, true
	default:
		p.HasOlder = more
	}
	return p, nil
}

// UserCharges lists a user's charges of the mode, newest first, those before the cursor when one
// is given (charges_user_idx).
func (s *Service) UserCharges(ctx context.Context, userID string, livemode bool, before *ChargeCursor, limit int) ([]ChargeRow, error) {
	q := chargeFrom + ` AND c.user_id = $2`
	args := []any{livemode, userID, limit}
	if before != nil {
		q += ` AND (c.created_at, c.order_id) < ($4, $5)`
		args = append(args, before.CreatedAt, before.OrderID)
	}
	out := []ChargeRow{}
	if err := s.db.WithContext(ctx).Raw(q+` ORDER BY c.created_at DESC, c.order_id DESC LIMIT $3`, args...).Scan(&out).Error; err != nil {
		return nil, fmt.Errorf("list charges of user %s: %w", userID, err)
	}
	return out, nil
}

// Charge returns one charge of the mode, nil when unknown.
func (s *Service) Charge(ctx context.Context, orderID string, livemode bool) (*ChargeRow, error) {
	var out []ChargeRow
	if err := s.db.WithContext(ctx).Raw(chargeFrom+` AND c.order_id = $2`, livemode, orderID).Scan(&out).Error; err != nil {
		return nil, fmt.Errorf("load charge %s: %w", orderID, err)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return &out[0], nil
}

// RefundRow is one refund of the ledger.
type RefundRow struct {
	OrderID        string    `gorm:"column:order_id"`
	RefundID       string    `gorm:"column:refund_id"`
	Livemode       bool      `gorm:"column:livemode"`
	Amount         int64     `gorm:"column:amount"`
	Currency       string    `gorm:"column:currency"`
	Reason         *string   `gorm:"column:reason"`
	State          string    `gorm:"column:state"`
	Status         *string   `gorm:"column:status"`
	StripeRefundID *string   `gorm:"column:stripe_refund_id"`
	FailureReason  *string   `gorm:"column:failure_reason"`
	ErrorCode      *string   `gorm:"column:error_code"`
	CreatedAt      time.Time `gorm:"column:created_at"`
}

const refundColumns = `r.order_id, r.refund_id, r.livemode, r.amount, c.currency, r.reason, r.state, r.status,
	r.stripe_refund_id, r.failure_reason, r.error_code, r.created_at`

// ChargeRefunds lists the refunds of a charge, oldest first.
func (s *Service) ChargeRefunds(ctx context.Context, orderID string, livemode bool) ([]RefundRow, error) {
	out := []RefundRow{}
	err := s.db.WithContext(ctx).Raw(`SELECT `+refundColumns+`
		FROM refunds r JOIN charges c ON c.order_id = r.order_id AND c.livemode = r.livemode
		WHERE r.order_id = $1 AND r.livemode = $2 ORDER BY r.created_at, r.refund_id`, orderID, livemode).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list refunds of %s: %w", orderID, err)
	}
	return out, nil
}

// RefundsOf lists the refunds of the charges named, of the mode, oldest first.
func (s *Service) RefundsOf(ctx context.Context, orderIDs []string, livemode bool) ([]RefundRow, error) {
	out := []RefundRow{}
	if len(orderIDs) == 0 {
		return out, nil
	}
	err := s.db.WithContext(ctx).Raw(`SELECT `+refundColumns+`
		FROM refunds r JOIN charges c ON c.order_id = r.order_id AND c.livemode = r.livemode
		WHERE r.order_id = ANY ($1) AND r.livemode = $2 ORDER BY r.created_at, r.refund_id`,
		orderIDs, livemode).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list refunds: %w", err)
	}
	return out, nil
}

// FindCharges returns the charges of the mode that id names: an order id, a PaymentIntent id,
// or a refund's id (the app's refund_id, or Stripe's re_…); at most limit, newest first.
func (s *Service) FindCharges(ctx context.Context, id string, livemode bool, limit int) ([]ChargeRow, error) {
	out := []ChargeRow{}
	err := s.db.WithContext(ctx).Raw(chargeFrom+` AND (c.order_id = $2 OR c.payment_intent_id = $2
		   OR c.order_id = ANY (ARRAY(SELECT r.order_id FROM refunds r
		                              WHERE r.livemode = $1 AND (r.refund_id = $2 OR r.stripe_refund_id = $2))))
		ORDER BY c.created_at DESC, c.order_id DESC LIMIT $3`, livemode, id, limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("find charges by %q: %w", id, err)
	}
	return out, nil
}
