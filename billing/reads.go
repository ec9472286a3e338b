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
	"gorm.io/gorm"

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
	// Quantity is the seats: the quantity of the licensed item.
	Quantity *int64 `json:"quantity"`
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
	// Quantity is the seats of the subscription reported: its licensed item's quantity.
	Quantity *int64 `json:"quantity"`
	// Features are the lookup keys of the customer's active entitlements at Stripe, sorted,
	// granted only while the policy grants features (Policy.FeaturesGranted); never null.
	Features []string `json:"features"`
}

// noFeatures is the features of an answer that grants none: [] in JSON, never null.
var noFeatures = []string{}

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
	s.payment_hold_billing_reason, s.payment_hold_kind, s.pause_collection_behavior, s.pause_collection_resumes_at,
	s.quantity`

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
	features, err := s.CustomerFeatures(ctx, deref(c.StripeCustomerID), c.Livemode)
	if err != nil {
		return nil, err
	}
	now := s.now()
	v := &CustomerView{
		UserID:           c.UserID,
		StripeCustomerID: c.StripeCustomerID,
		Livemode:         c.Livemode,
		Subscriptions:    make([]SubscriptionView, 0, len(subs)),
		Entitlement:      s.entitlementOf(c.UserID, subs, features.LookupKeys, now),
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
	rd, err := s.readEntitlement(ctx, entitlementQuery, userID)
	if err != nil {
		return nil, err
	}
	e := s.entitlementOf(userID, rd.subs, rd.features, s.now())
	return &e, nil
}

// entitlementColumns are what entitlementQuery and featureQuery read of a user's linked
// customer's subscriptions: only the columns the policy decides with (Best, Entitled,
// Unconfirmed, Hold) and the answer shows, half of subscriptionColumns, for each column costs the
// driver an allocation or more per row. A linked customer without subscriptions is one row with
// a null subscription (subscription_id ""), so that it is told apart from an unknown user. The
// customer's features (customer_features, by its primary key) come in the same row: one
// statement, one round trip.
const entitlementColumns = `SELECT coalesce(s.subscription_id, ''), coalesce(s.status, ''), s.price_id,
	s.current_period_end, coalesce(s.cancel_at_period_end, false), s.trial_end, s.status_since,
	s.sub_event_created, coalesce(s.payment_hold, false), s.payment_hold_since, s.inv_event_created,
	s.payment_hold_billing_reason, s.payment_hold_kind, s.pause_collection_behavior, s.pause_collection_resumes_at,
	s.quantity, `

const entitlementFrom = `
	FROM customers c LEFT JOIN subscriptions s ON s.stripe_customer_id = c.stripe_customer_id AND s.livemode = c.livemode
	LEFT JOIN customer_features f ON f.stripe_customer_id = c.stripe_customer_id AND f.livemode = c.livemode
	WHERE c.user_id = $1 AND c.livemode = $2 AND c.stripe_customer_id IS NOT NULL
	ORDER BY s.created_at, s.subscription_id`

// entitlementQuery reads the entitlement with the customer's whole list of features.
const entitlementQuery = entitlementColumns + `f.lookup_keys` + entitlementFrom

// featureQuery reads the entitlement with whether one feature ($3) is in the customer's list:
// a boolean instead of the list, however long the list.
const featureQuery = entitlementColumns + `coalesce(CAST($3 AS text) = ANY(f.lookup_keys), false)` + entitlementFrom

// entitlementRow is one row of entitlementQuery or featureQuery. Its fields are the scan's
// destinations, in the query's order, so that a read allocates them once and not per column;
// pgtype's types are pgx's own (no conversion through driver.Value) and database/sql scanners
// as well.
type entitlementRow struct {
	sub                                                   Subscription
	priceID, billingReason, holdKind, pauseBehavior       pgtype.Text
	periodEnd, trialEnd, statusSince, subEvent, holdSince pgtype.Timestamptz
	invEvent, pauseResumes                                pgtype.Timestamptz
	quantity                                              pgtype.Int8
	// features is entitlementQuery's last column, hasFeature featureQuery's.
	features   []string
	hasFeature bool
	dest       [17]any
}

// newEntitlementRow makes the destinations of a query's rows; feature says the query is
// featureQuery, viaSQL that the rows come through database/sql (which cannot scan an array by
// itself).
func newEntitlementRow(feature, viaSQL bool) *entitlementRow {
	r := &entitlementRow{}
	r.dest = [17]any{&r.sub.SubscriptionID, &r.sub.Status, &r.priceID, &r.periodEnd, &r.sub.CancelAtPeriodEnd,
		&r.trialEnd, &r.statusSince, &r.subEvent, &r.sub.PaymentHold, &r.holdSince, &r.invEvent, &r.billingReason,
		&r.holdKind, &r.pauseBehavior, &r.pauseResumes, &r.quantity, &r.features}
	switch {
	case feature:
		r.dest[16] = &r.hasFeature
	case viaSQL:
		r.dest[16] = pgtype.NewMap().SQLScanner(&r.features)
	}
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
	if r.quantity.Valid {
		q := r.quantity.Int64
		sub.Quantity = &q
	}
	return sub
}

// rowScanner is what pgx.Rows and *sql.Rows have in common.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// entitlementRead is what entitlementQuery or featureQuery read of a user.
type entitlementRead struct {
	subs []Subscription
	// features is the customer's list (entitlementQuery), hasFeature whether it holds the one
	// asked for (featureQuery).
	features   []string
	hasFeature bool
	// found is false when there were no rows (the user has no linked customer).
	found bool
}

// scanEntitlementRows reads rows of query into rd.
func scanEntitlementRows(rows rowScanner, query string, viaSQL bool) (rd entitlementRead, err error) {
	r := newEntitlementRow(query == featureQuery, viaSQL)
	for rows.Next() {
		rd.found = true
		if err := rows.Scan(r.dest[:]...); err != nil {
			return entitlementRead{}, err
		}
		if r.sub.SubscriptionID != "" {
			rd.subs = append(rd.subs, r.subscription())
		}
	}
	rd.features, rd.hasFeature = r.features, r.hasFeature
	return rd, rows.Err()
}

// readEntitlement runs entitlementQuery or featureQuery (args after the user id: the feature)
// and returns ErrNoCustomer when the user has no linked customer. On the service's pool it runs
// on one of the pool's connections with pgx itself (see queryPgx); through any other handle,
// with database/sql.
func (s *Service) readEntitlement(ctx context.Context, query, userID string, args ...any) (entitlementRead, error) {
	return s.readEntitlementOn(ctx, s.db.Statement.ConnPool, query, userID, args...)
}

// readEntitlementOn is readEntitlement through the handle on: the service's pool, or a
// transaction's (which sees the transaction's own writes).
func (s *Service) readEntitlementOn(ctx context.Context, on gorm.ConnPool, query, userID string, args ...any) (entitlementRead, error) {
	var rd entitlementRead
	var err error
	args = append([]any{userID, s.livemode}, args...)
	if pool, ok := on.(*sql.DB); ok {
		err = queryPgx(ctx, pool, func(conn *pgx.Conn) error {
			rows, err := conn.Query(ctx, query, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			rd, err = scanEntitlementRows(rows, query, false)
			return err
		})
	} else {
		var rows *sql.Rows
		rows, err = on.QueryContext(ctx, query, args...)
		if err == nil {
			rd, err = scanEntitlementRows(rows, query, true)
			if cerr := rows.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		return rd, fmt.Errorf("load customer of user %q: %w", userID, err)
	}
	if !rd.found {
		return rd, ErrNoCustomer
	}
	return rd, nil
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

// entitlementOf is the entitlement of a user with these subscriptions and the customer's
// features (Stripe's active entitlements, sorted), which it grants only as the policy says.
func (s *Service) entitlementOf(userID string, subs []Subscription, features []string, now time.Time) Entitlement {
	e := Entitlement{UserID: userID, Status: StatusNone, Features: noFeatures}
	best := s.policy.Best(subs, now)
	if best == nil {
		return e
	}
	e.Quantity = best.Quantity
	if s.policy.FeaturesGranted(best, now) && len(features) > 0 {
		e.Features = features
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
		Quantity:           sub.Quantity,
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
