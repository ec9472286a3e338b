package entitlements

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"gorm.io/gorm"

	"billing/billing"
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
	billing.FailedInvoice
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

// Customer returns the customer view of a user, or ErrNoCustomer when the user has no
// linked Stripe customer. Local state only: Stripe is never called.
func (s *Service) Customer(ctx context.Context, userID string) (*CustomerView, error) {
	c, subs, err := s.billing.CustomerSubscriptions(ctx, userID)
	if err != nil {
		return nil, err
	}
	features, err := s.CustomerFeatures(ctx, derefString(c.StripeCustomerID), c.Livemode)
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
	sub                                                   billing.Subscription
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
func (r *entitlementRow) subscription() billing.Subscription {
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
	subs []billing.Subscription
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
func (s *Service) entitlementOf(userID string, subs []billing.Subscription, features []string, now time.Time) Entitlement {
	e := Entitlement{UserID: userID, Status: billing.StatusNone, Features: noFeatures}
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
	e.CurrentPeriodEnd = billing.UTC(best.CurrentPeriodEnd)
	e.CancelAtPeriodEnd = best.CancelAtPeriodEnd
	e.TrialEnd = billing.UTC(best.TrialEnd)
	e.UnconfirmedSince = billing.UTC(s.policy.Unconfirmed(best, now))
	// The hold of the subscription the answer is about, never another's: a held subscription
	// that is not the one reported would contradict subscription_id and status.
	if reason, _, ok := best.Hold(); ok {
		e.OnHold = true
		e.HoldReason = &reason
	}
	return e
}

func (s *Service) subscriptionView(sub *billing.Subscription, now time.Time) SubscriptionView {
	v := SubscriptionView{
		SubscriptionID:     sub.SubscriptionID,
		StripeCustomerID:   sub.StripeCustomerID,
		Livemode:           sub.Livemode,
		Status:             sub.Status,
		Entitled:           s.policy.Entitled(sub, now),
		PriceID:            sub.PriceID,
		CurrentPeriodStart: billing.UTC(sub.CurrentPeriodStart),
		CurrentPeriodEnd:   billing.UTC(sub.CurrentPeriodEnd),
		CancelAtPeriodEnd:  sub.CancelAtPeriodEnd,
		CancelAt:           billing.UTC(sub.CancelAt),
		CanceledAt:         billing.UTC(sub.CanceledAt),
		EndedAt:            billing.UTC(sub.EndedAt),
		TrialStart:         billing.UTC(sub.TrialStart),
		TrialEnd:           billing.UTC(sub.TrialEnd),
		UnconfirmedSince:   billing.UTC(s.policy.Unconfirmed(sub, now)),
		FailedInvoice:      sub.FailedInvoice(),
		CollectionPaused:   sub.CollectionPaused(now),
		Quantity:           sub.Quantity,
	}
	if reason, since, ok := sub.Hold(); ok {
		v.OnHold = true
		v.HoldReason = &reason
		v.OnHoldSince = billing.UTC(since)
	}
	return v
}

// ErrNoCustomer means the user has no linked Stripe customer: billing's, so that either name
// matches the error of either package's reads.
var ErrNoCustomer = billing.ErrNoCustomer

func derefString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
