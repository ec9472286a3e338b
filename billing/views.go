package billing

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"billing/internal/database"
)

// SubscriptionView is one subscription in GET /v1/customers/{user_id}.
type SubscriptionView struct {
	SubscriptionID     string     `json:"subscription_id"`
	StripeCustomerID   string     `json:"stripe_customer_id"`
	Livemode           bool       `json:"livemode"`
	Status             string     `json:"status"`
	Entitled           bool       `json:"entitled"`
	PriceID            *string    `json:"price_id"`
	CurrentPeriodStart *time.Time `json:"current_period_start"`
	CurrentPeriodEnd   *time.Time `json:"current_period_end"`
	CancelAtPeriodEnd  bool       `json:"cancel_at_period_end"`
	CancelAt           *time.Time `json:"cancel_at"`
	CanceledAt         *time.Time `json:"canceled_at"`
	EndedAt            *time.Time `json:"ended_at"`
	TrialStart         *time.Time `json:"trial_start"`
	TrialEnd           *time.Time `json:"trial_end"`
	OnHold             bool       `json:"on_hold"`
	HoldReason         *string    `json:"hold_reason"`
	OnHoldSince        *time.Time `json:"on_hold_since"`
	// CollectionPaused: pause_collection is in force (see policy.paused_collection_entitled).
	CollectionPaused bool `json:"collection_paused"`
	// UnconfirmedSince: see Entitlement.
	UnconfirmedSince *time.Time `json:"unconfirmed_since"`
	FailedInvoice
}

// FailedInvoice is the failed invoice of a payment hold in force, every field null otherwise.
// Its fields appear inline in the JSON of the views that embed it.
type FailedInvoice struct {
	AttemptCount       *int64     `json:"attempt_count"`
	NextPaymentAttempt *time.Time `json:"next_payment_attempt"`
	AmountDue          *int64     `json:"amount_due"`
	Currency           *string    `json:"currency"`
	HostedInvoiceURL   *string    `json:"hosted_invoice_url"`
}

func (s *Subscription) failedInvoice() FailedInvoice {
	if !s.paymentHoldInForce() {
		return FailedInvoice{}
	}
	return FailedInvoice{
		AttemptCount:       s.AttemptCount,
		NextPaymentAttempt: utc(s.NextPaymentAttempt),
		AmountDue:          s.AmountDue,
		Currency:           s.Currency,
		HostedInvoiceURL:   s.HostedInvoiceURL,
	}
}

// Entitlement is GET /v1/customers/{user_id}/entitlement: whether the user gets access now, and
// the subscription that decides it (see Policy.Best). on_hold and hold_reason are that
// subscription's own. unconfirmed_since, when set, is why an active or trialing subscription is not
// entitled: its period (or trial) ended then, more than policy.period_grace ago, and Stripe has
// not confirmed a renewal (no event, and the re-read failed or still showed the old period).
type Entitlement struct {
	UserID            string     `json:"user_id"`
	Entitled          bool       `json:"entitled"`
	Status            string     `json:"status"`
	OnHold            bool       `json:"on_hold"`
	HoldReason        *string    `json:"hold_reason"`
	SubscriptionID    *string    `json:"subscription_id"`
	PriceID           *string    `json:"price_id"`
	CurrentPeriodEnd  *time.Time `json:"current_period_end"`
	CancelAtPeriodEnd bool       `json:"cancel_at_period_end"`
	TrialEnd          *time.Time `json:"trial_end"`
	UnconfirmedSince  *time.Time `json:"unconfirmed_since"`
}

// CustomerView is GET /v1/customers/{user_id}.
type CustomerView struct {
	UserID           string             `json:"user_id"`
	StripeCustomerID *string            `json:"stripe_customer_id"`
	Livemode         bool               `json:"livemode"`
	Subscriptions    []SubscriptionView `json:"subscriptions"`
	Entitlement      Entitlement        `json:"entitlement"`
}

// HoldView is one entry of GET /admin/holds.
type HoldView struct {
	SubscriptionID   string     `json:"subscription_id"`
	StripeCustomerID string     `json:"stripe_customer_id"`
	UserID           *string    `json:"user_id"`
	Status           string     `json:"status"`
	HoldReason       string     `json:"hold_reason"`
	OnHoldSince      *time.Time `json:"on_hold_since"`
	FailedInvoice
	Livemode bool `json:"livemode"`
}

// subscriptionRowColumns are the columns a Subscription is read from, named as its fields' column
// tags (database.ScanAll matches them by name), the customer's user id excepted. The NOT NULL
// columns are coalesced so that the LEFT JOIN of a customer without subscriptions scans too (its
// subscription_id is then "").
const subscriptionRowColumns = `coalesce(s.subscription_id, '') AS subscription_id,
	coalesce(s.stripe_customer_id, '') AS stripe_customer_id, coalesce(s.livemode, false) AS livemode,
	coalesce(s.status, '') AS status, s.price_id, s.current_period_start, s.current_period_end,
	coalesce(s.cancel_at_period_end, false) AS cancel_at_period_end, s.cancel_at, s.canceled_at, s.ended_at,
	s.trial_start, s.trial_end, s.status_since, s.sub_event_id, s.sub_event_created, s.trial_will_end_at,
	coalesce(s.payment_hold, false) AS payment_hold, s.payment_hold_since, s.latest_invoice_id, s.attempt_count,
	s.next_payment_attempt, s.amount_due, s.currency, s.hosted_invoice_url, s.inv_event_created,
	s.payment_hold_billing_reason, s.payment_hold_kind, s.pause_collection_behavior, s.pause_collection_resumes_at`

// subscriptionColumns are subscriptionRowColumns and the user id of the customer joined as c.
const subscriptionColumns = subscriptionRowColumns + `, c.user_id`

// customerSubscriptionRow is one row of a customer joined to its subscriptions.
type customerSubscriptionRow struct {
	CustomerStripeID *string `gorm:"column:customer_stripe_id"`
	CustomerLivemode bool    `gorm:"column:customer_livemode"`
	Subscription
}

// queryCustomerSubscriptions runs query (which selects the customer's stripe_customer_id AS
// customer_stripe_id, its livemode AS customer_livemode, and subscriptionColumns) on the
// handle's own connection, without gorm's callbacks: the reads of the app's hot paths skip gorm's
// per-statement reflection, which was an eighth of their CPU.
func (s *Service) queryCustomerSubscriptions(ctx context.Context, query string, args ...any) ([]customerSubscriptionRow, error) {
	rows, err := s.db.Statement.ConnPool.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return database.ScanAll[customerSubscriptionRow](rows)
}

// ErrNoCustomer means the user has no linked Stripe customer.
var ErrNoCustomer = errors.New("no customer is linked to the user")

// linkedCustomer is the customer side of a customer view.
type linkedCustomer struct {
	UserID           string
	StripeCustomerID *string
	Livemode         bool
}

// customerWithSubscriptions loads a user's linked customer and its subscriptions in one
// statement: the entitlement read is the app's hottest path, one round trip instead of two.
// Only the deployment's world answers: its link of the user, and its subscriptions of that
// customer; a row of the other mode never reaches the view.
func (s *Service) customerWithSubscriptions(ctx context.Context, userID string) (*linkedCustomer, []Subscription, error) {
	rows, err := s.queryCustomerSubscriptions(ctx, `
		SELECT c.stripe_customer_id AS customer_stripe_id, c.livemode AS customer_livemode, `+subscriptionColumns+`
		FROM customers c LEFT JOIN subscriptions s ON s.stripe_customer_id = c.stripe_customer_id AND s.livemode = c.livemode
		WHERE c.user_id = $1 AND c.livemode = $2 AND c.stripe_customer_id IS NOT NULL
		ORDER BY s.created_at, s.subscription_id`, userID, s.livemode)
	if err != nil {
		return nil, nil, fmt.Errorf("load customer of user %q: %w", userID, err)
	}
	if len(rows) == 0 {
		return nil, nil, ErrNoCustomer
	}
	c := &linkedCustomer{UserID: userID, StripeCustomerID: rows[0].CustomerStripeID, Livemode: rows[0].CustomerLivemode}
	subs := make([]Subscription, 0, len(rows))
	for _, r := range rows {
		if r.SubscriptionID != "" {
			subs = append(subs, r.Subscription)
		}
	}
	return c, subs, nil
}

// Customer returns the customer view of a user, or ErrNoCustomer when the user has no
// linked Stripe customer. Local state only: Stripe is never called.
func (s *Service) Customer(ctx context.Context, userID string) (*CustomerView, error) {
	c, subs, err := s.customerWithSubscriptions(ctx, userID)
	if err != nil {
		return nil, err
	}
	now := s.now()
	v := &CustomerView{
		UserID:           c.UserID,
		StripeCustomerID: c.StripeCustomerID,
		Livemode:         c.Livemode,
		Subscriptions:    make([]SubscriptionView, 0, len(subs)),
		Entitlement:      s.entitlementOf(c.UserID, subs, now),
	}
	for i := range subs {
		v.Subscriptions = append(v.Subscriptions, s.subscriptionView(&subs[i], now))
	}
	return v, nil
}

// Entitlement answers whether a user is entitled now, or ErrNoCustomer for an unknown
// user. Local state only: Stripe is never called. It is the entitlement of Customer's view, read
// without the rest of the view: the app's hottest path.
func (s *Service) Entitlement(ctx context.Context, userID string) (*Entitlement, error) {
	subs, err := s.entitlementSubscriptions(ctx, userID)
	if err != nil {
		return nil, err
	}
	e := s.entitlementOf(userID, subs, s.now())
	return &e, nil
}

// entitlementQuery reads a user's linked customer's subscriptions, only the columns the policy
// decides with (Best, Entitled, Unconfirmed, Hold) and the answer shows: half of
// subscriptionColumns, and each column costs the driver an allocation or more per row. A
// linked customer without subscriptions is one row with a null subscription (subscription_id
// ""), so that it is told apart from an unknown user.
const entitlementQuery = `SELECT coalesce(s.subscription_id, ''), coalesce(s.status, ''), s.price_id,
	s.current_period_end, coalesce(s.cancel_at_period_end, false), s.trial_end, s.status_since,
	s.sub_event_created, coalesce(s.payment_hold, false), s.payment_hold_since, s.inv_event_created,
	s.payment_hold_billing_reason, s.payment_hold_kind, s.pause_collection_behavior, s.pause_collection_resumes_at
	FROM customers c LEFT JOIN subscriptions s ON s.stripe_customer_id = c.stripe_customer_id AND s.livemode = c.livemode
	WHERE c.user_id = $1 AND c.livemode = $2 AND c.stripe_customer_id IS NOT NULL
	ORDER BY s.created_at, s.subscription_id`

// entitlementRow is one row of entitlementQuery. Its fields are the scan's destinations, in the
// query's order, so that a read allocates them once and not per column; pgtype's types are
// pgx's own (no conversion through driver.Value) and database/sql scanners as well.
type entitlementRow struct {
	sub                                                   Subscription
	priceID, billingReason, holdKind, pauseBehavior       pgtype.Text
	periodEnd, trialEnd, statusSince, subEvent, holdSince pgtype.Timestamptz
	invEvent, pauseResumes                                pgtype.Timestamptz
	dest                                                  [15]any
}

func newEntitlementRow() *entitlementRow {
	r := &entitlementRow{}
	r.dest = [15]any{&r.sub.SubscriptionID, &r.sub.Status, &r.priceID, &r.periodEnd, &r.sub.CancelAtPeriodEnd,
		&r.trialEnd, &r.statusSince, &r.subEvent, &r.sub.PaymentHold, &r.holdSince, &r.invEvent, &r.billingReason,
		&r.holdKind, &r.pauseBehavior, &r.pauseResumes}
	return r
}

// subscription is the row's subscription, with only the columns of entitlementQuery set.
func (r *entitlementRow) subscription() Subscription {
	sub := r.sub
	sub.PriceID, sub.PaymentHoldBillingReason = validText(r.priceID), validText(r.billingReason)
	sub.PaymentHoldKind, sub.PauseCollectionBehavior = validText(r.holdKind), validText(r.pauseBehavior)
	sub.CurrentPeriodEnd, sub.TrialEnd, sub.StatusSince = validTime(r.periodEnd), validTime(r.trialEnd), validTime(r.statusSince)
	sub.SubEventCreated, sub.PaymentHoldSince = validTime(r.subEvent), validTime(r.holdSince)
	sub.InvEventCreated, sub.PauseCollectionResumesAt = validTime(r.invEvent), validTime(r.pauseResumes)
	return sub
}

// rowScanner is what pgx.Rows and *sql.Rows have in common.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanEntitlementRows reads rows of entitlementQuery; found is false when there were none (the
// user has no linked customer).
func scanEntitlementRows(rows rowScanner) (subs []Subscription, found bool, err error) {
	r := newEntitlementRow()
	for rows.Next() {
		found = true
		if err := rows.Scan(r.dest[:]...); err != nil {
			return nil, false, err
		}
		if r.sub.SubscriptionID != "" {
			subs = append(subs, r.subscription())
		}
	}
	return subs, found, rows.Err()
}

// entitlementSubscriptions runs entitlementQuery and returns ErrNoCustomer when the user has no
// linked customer. On the service's pool it runs on one of the pool's connections with pgx
// itself (see queryPgx); through any other handle, with database/sql.
func (s *Service) entitlementSubscriptions(ctx context.Context, userID string) ([]Subscription, error) {
	var subs []Subscription
	var found bool
	var err error
	if pool, ok := s.db.Statement.ConnPool.(*sql.DB); ok {
		err = queryPgx(ctx, pool, func(conn *pgx.Conn) error {
			rows, err := conn.Query(ctx, entitlementQuery, userID, s.livemode)
			if err != nil {
				return err
			}
			defer rows.Close()
			subs, found, err = scanEntitlementRows(rows)
			return err
		})
	} else {
		var rows *sql.Rows
		rows, err = s.db.Statement.ConnPool.QueryContext(ctx, entitlementQuery, userID, s.livemode)
		if err == nil {
			subs, found, err = scanEntitlementRows(rows)
			if cerr := rows.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("load customer of user %q: %w", userID, err)
	}
	if !found {
		return nil, ErrNoCustomer
	}
	return subs, nil
}

// queryPgx runs f with the pgx connection under one of pool's connections. database/sql's own
// query path costs the entitlement read a goroutine per query (watching the request's context),
// a value conversion per column and an allocation per column per query in pgx's database/sql
// adapter; pgx itself watches the context without a goroutine and decodes into the
// destinations. The connection is the pool's like any other. As database/sql does, a connection
// that fails before the query reached the server is dropped and the query tried on another, at
// most twice more.
func queryPgx(ctx context.Context, pool *sql.DB, f func(*pgx.Conn) error) error {
	var err error
	for range 3 {
		var conn *sql.Conn
		conn, err = pool.Conn(ctx)
		if err != nil {
			return err
		}
		err = conn.Raw(func(dc any) error {
			pc, ok := dc.(interface{ Conn() *pgx.Conn })
			if !ok {
				return fmt.Errorf("database driver %T is not pgx", dc)
			}
			if err := f(pc.Conn()); err != nil {
				if pgconn.SafeToRetry(err) && ctx.Err() == nil {
					// database/sql closes the connection rather than handing it out again.
					return errors.Join(driver.ErrBadConn, err)
				}
				return err
			}
			return nil
		})
		_ = conn.Close()
		if !errors.Is(err, driver.ErrBadConn) {
			return err
		}
	}
	return err
}

func validText(v pgtype.Text) *string {
	if !v.Valid {
		return nil
	}
	return &v.String
}

func validTime(v pgtype.Timestamptz) *time.Time {
	if !v.Valid {
		return nil
	}
	return &v.Time
}

func (s *Service) entitlementOf(userID string, subs []Subscription, now time.Time) Entitlement {
	e := Entitlement{UserID: userID, Status: StatusNone}
	best := s.policy.Best(subs, now)
	if best == nil {
		return e
	}
	e.Entitled = s.policy.Entitled(best, now)
	e.Status = best.Status
	e.SubscriptionID = &best.SubscriptionID
	e.PriceID = best.PriceID
	e.CurrentPeriodEnd = utc(best.CurrentPeriodEnd)
	e.CancelAtPeriodEnd = best.CancelAtPeriodEnd
	e.TrialEnd = utc(best.TrialEnd)
	e.UnconfirmedSince = utc(s.policy.Unconfirmed(best, now))
	// The hold of the subscription the answer is about, never another's: a held subscription
	// that is not the one reported would contradict subscription_id and status.
	if reason, _, ok := best.Hold(); ok {
		e.OnHold = true
		e.HoldReason = &reason
	}
	return e
}

func (s *Service) subscriptionView(sub *Subscription, now time.Time) SubscriptionView {
	v := SubscriptionView{
		SubscriptionID:     sub.SubscriptionID,
		StripeCustomerID:   sub.StripeCustomerID,
		Livemode:           sub.Livemode,
		Status:             sub.Status,
		Entitled:           s.policy.Entitled(sub, now),
		PriceID:            sub.PriceID,
		CurrentPeriodStart: utc(sub.CurrentPeriodStart),
		CurrentPeriodEnd:   utc(sub.CurrentPeriodEnd),
		CancelAtPeriodEnd:  sub.CancelAtPeriodEnd,
		CancelAt:           utc(sub.CancelAt),
		CanceledAt:         utc(sub.CanceledAt),
		EndedAt:            utc(sub.EndedAt),
		TrialStart:         utc(sub.TrialStart),
		TrialEnd:           utc(sub.TrialEnd),
		UnconfirmedSince:   utc(s.policy.Unconfirmed(sub, now)),
		FailedInvoice:      sub.failedInvoice(),
		CollectionPaused:   sub.CollectionPaused(now),
	}
	if reason, since, ok := sub.Hold(); ok {
		v.OnHold = true
		v.HoldReason = &reason
		v.OnHoldSince = utc(since)
	}
	return v
}

// Holds lists every subscription on hold now, the longest-held first. Customers not linked to a
// user are included with a nil UserID.
func (s *Service) Holds(ctx context.Context) ([]HoldView, error) {
	// The WHERE clause is a cheap superset (it matches the partial index); Hold() decides.
	rows, err := s.queryCustomerSubscriptions(ctx, `/* all modes: the admin's holds, each with its mode */
		SELECT c.stripe_customer_id AS customer_stripe_id, coalesce(c.livemode, false) AS customer_livemode, `+subscriptionColumns+`
		FROM subscriptions s LEFT JOIN customers c ON c.stripe_customer_id = s.stripe_customer_id AND c.livemode = s.livemode
		WHERE s.status NOT IN ('canceled', 'incomplete_expired')
		  AND (s.payment_hold OR s.status IN ('past_due', 'unpaid'))`)
	if err != nil {
		return nil, fmt.Errorf("load holds: %w", err)
	}
	holds := make([]HoldView, 0, len(rows))
	for i := range rows {
		sub := &rows[i].Subscription
		reason, since, ok := sub.Hold()
		if !ok {
			continue
		}
		holds = append(holds, HoldView{
			SubscriptionID:   sub.SubscriptionID,
			StripeCustomerID: sub.StripeCustomerID,
			UserID:           sub.UserID,
			Status:           sub.Status,
			HoldReason:       reason,
			OnHoldSince:      utc(since),
			FailedInvoice:    sub.failedInvoice(),
			Livemode:         sub.Livemode,
		})
	}
	slices.SortFunc(holds, func(a, b HoldView) int {
		if c := compareTime(a.OnHoldSince, b.OnHoldSince, false); c != 0 {
			return c
		}
		return cmp.Compare(a.SubscriptionID, b.SubscriptionID)
	})
	return holds, nil
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
