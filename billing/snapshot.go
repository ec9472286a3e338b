package billing

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"

	"billing/internal/database"
	"billing/webhooks"
)

// Stripe is the truth; webhooks are news of it. Where the local state could be wrong (a missed
// event, a period end with no renewal, two events in one second), the subscription is read from
// Stripe and applied here, through the very code that applies events, so that holds, terminal
// states and the entitlement policy behave the same whichever way the truth arrived.
//
// A fetched object is Stripe's state at the moment of the fetch. It is applied as an event created
// then (the fetch time, floored to Stripe's whole seconds), so the ordering guard keeps the newer
// of the two whatever the order: an event newer than the fetch is not undone by it, and an event
// older than the fetch does not undo the repair. Within one second the snapshot ranks below every
// event (snapshotRank), because Stripe's seconds cannot say whether the event came before or after
// the read; the events of that second decide, and a later read settles any doubt left.

// Snapshot is a subscription as read from Stripe, with its latest invoice when known.
type Snapshot struct {
	Livemode bool
	// Subscription is the subscription object as Stripe's API (version 2024-06-20) returns it.
	Subscription json.RawMessage
	// LatestInvoice is its latest invoice object (expanded), or nil when it has none or it was not
	// read. It decides the payment hold: open and attempted holds, paid or void lifts.
	LatestInvoice json.RawMessage
	// FetchedAt is when Stripe answered.
	FetchedAt time.Time
	// Source names the read for the row's history ("reconcile:RUN", "reread:SUBSCRIPTION"); it is
	// stored where an event id would be.
	Source string
}

// SnapshotOutcome says what applying a snapshot changed.
type SnapshotOutcome struct {
	SubscriptionApplied bool
	InvoiceApplied      bool
}

// snapshotRank is below every event rank: a snapshot loses ties within one second.
const snapshotRank = -1

type snapshotKey struct{}

func isSnapshot(ctx context.Context) bool { v, _ := ctx.Value(snapshotKey{}).(bool); return v }

// rankOf is the rank an apply stores: the event's own, or snapshotRank for a snapshot.
func rankOf(ctx context.Context, eventRank int) int {
	if isSnapshot(ctx) {
		return snapshotRank
	}
	return eventRank
}

// ApplySnapshot applies a subscription read from Stripe inside tx, as the event handlers would.
// No notice is sent for what a snapshot reveals: the mail of a payment that failed, or of a trial
// that ends, belongs to the event of that moment, and a late read only learns it after the fact.
func (s *Service) ApplySnapshot(ctx context.Context, tx *gorm.DB, snap Snapshot) (SnapshotOutcome, error) {
	var out SnapshotOutcome
	obj, err := decodeSubscription(snap.Subscription)
	if err != nil {
		return out, fmt.Errorf("snapshot %s: %w", snap.Source, err)
	}
	ctx = context.WithValue(ctx, snapshotKey{}, true)
	created := snap.FetchedAt.UTC().Truncate(time.Second)
	typ := EventSubscriptionUpdated
	if IsTerminal(obj.Status) {
		typ = EventSubscriptionDeleted
	}
	ev := webhooks.Event{ID: snap.Source, Type: typ, Livemode: snap.Livemode, Created: created, Object: snap.Subscription}
	// Applied is the handler's own verdict (its guarded UPDATE took the row): no read of the
	// row before and after, which cost a backfill two round trips per subscription and group.
	if out.SubscriptionApplied, err = s.applySubscriptionEvent(ctx, tx, ev); err != nil {
		return out, err
	}
	if err := recordRead(ctx, tx, obj.ID, snap); err != nil {
		return out, err
	}

	if len(snap.LatestInvoice) == 0 || string(snap.LatestInvoice) == "null" {
		return out, nil
	}
	var inv struct {
		Status       string `json:"status"`
		AttemptCount int64  `json:"attempt_count"`
		Subscription any    `json:"subscription"`
	}
	if err := json.Unmarshal(snap.LatestInvoice, &inv); err != nil {
		return out, fmt.Errorf("snapshot %s: latest invoice: %w", snap.Source, err)
	}
	var invType string
	switch {
	case inv.Status == "open" && inv.AttemptCount > 0:
		invType = EventInvoicePaymentFailed
	case inv.Status == "paid" || inv.Status == "void":
		invType = EventInvoicePaymentSucceeded
	default:
		return out, nil // draft, not attempted yet, or uncollectible: nothing the hold reads
	}
	invEv := webhooks.Event{ID: snap.Source, Type: invType, Livemode: snap.Livemode, Created: created, Object: snap.LatestInvoice}
	if out.InvoiceApplied, err = s.applyInvoiceEvent(ctx, tx, invEv); err != nil {
		return out, err
	}
	return out, nil
}

// recordRead keeps the read in subscription_reads, in the transaction that applies it: the event
// log does not hold it, and `billing verify` replays it with the events.
func recordRead(ctx context.Context, tx *gorm.DB, subscriptionID string, snap Snapshot) error {
	var inv any
	if len(snap.LatestInvoice) > 0 && string(snap.LatestInvoice) != "null" {
		inv = string(snap.LatestInvoice)
	}
	_, err := database.Exec(ctx, tx, `
		INSERT INTO subscription_reads (livemode, subscription_id, source, fetched_at, subscription, latest_invoice)
		VALUES ($1, $2, $3, $4, CAST($5 AS jsonb), CAST($6 AS jsonb))`,
		snap.Livemode, subscriptionID, snap.Source, snap.FetchedAt.UTC(), string(snap.Subscription), inv)
	if err != nil {
		return fmt.Errorf("record read %s of %s: %w", snap.Source, subscriptionID, err)
	}
	return nil
}

// Subscription returns the local row of a subscription of one world (nil when unknown), with the
// user of its customer when linked there: what reconciliation compares with Stripe's object.
func (s *Service) Subscription(ctx context.Context, subscriptionID string, livemode bool) (*Subscription, error) {
	subs, err := s.Subscriptions(ctx, []string{subscriptionID}, livemode)
	if err != nil {
		return nil, err
	}
	return subs[subscriptionID], nil
}

// Subscriptions returns the local rows of subscriptions of one world by id, as Subscription does,
// in one query: a reconciliation page reads its hundred rows at once. Unknown ids are absent.
func (s *Service) Subscriptions(ctx context.Context, subscriptionIDs []string, livemode bool) (map[string]*Subscription, error) {
	rows, err := s.db.WithContext(ctx).Statement.ConnPool.QueryContext(ctx, `
		SELECT `+subscriptionColumns+`
		FROM subscriptions s LEFT JOIN customers c ON c.stripe_customer_id = s.stripe_customer_id AND c.livemode = s.livemode
		WHERE s.subscription_id = ANY($1) AND s.livemode = $2`, subscriptionIDs, livemode)
	if err != nil {
		return nil, fmt.Errorf("load %d subscriptions: %w", len(subscriptionIDs), err)
	}
	subs, err := database.ScanAll[Subscription](rows)
	if err != nil {
		return nil, fmt.Errorf("load %d subscriptions: %w", len(subscriptionIDs), err)
	}
	out := make(map[string]*Subscription, len(subs))
	for i := range subs {
		out[subs[i].SubscriptionID] = &subs[i]
	}
	return out, nil
}
