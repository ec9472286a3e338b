package checkout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/billing"
	"billing/internal/jobs"
	"billing/internal/stripeclient"
	"billing/webhooks"
)

// SyncJobKind is the River kind of SyncArgs; queued jobs name it, so it never changes.
const SyncJobKind = "checkout_subscription_sync"

// SyncArgs is the River job that reads the subscription of a completed Checkout session from
// Stripe and applies it. Source (the event id, or "read" for the success page) makes the job of
// each event its own, so a later event (async_payment_succeeded) reads the subscription again.
type SyncArgs struct {
	SessionID      string `json:"session_id" river:"unique"`
	SubscriptionID string `json:"subscription_id"`
	Livemode       bool   `json:"livemode"`
	Source         string `json:"source" river:"unique"`
}

func (SyncArgs) Kind() string { return SyncJobKind }

// InsertOpts: a bounded number of attempts (River's backoff spreads 10 over hours); the
// subscription's own events still bring its state if Stripe cannot be read that long.
func (SyncArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 10, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// queueSync inserts the read of a subscription in tx: it exists iff tx commits.
func (s *Service) queueSync(ctx context.Context, tx *gorm.DB, args SyncArgs) error {
	if s.jobs == nil {
		return errors.New("checkout: no job inserter configured")
	}
	sqlTx, err := jobs.SQLTx(tx)
	if err != nil {
		return err
	}
	if _, err := s.jobs.InsertTx(ctx, sqlTx, args, nil); err != nil {
		return fmt.Errorf("queue read of subscription %s: %w", args.SubscriptionID, err)
	}
	return nil
}

// SyncWorker runs the SyncArgs jobs. It is registered with River before the service exists (River
// needs its workers first, the service needs River's client); Bind hands it the service.
type SyncWorker struct {
	river.WorkerDefaults[SyncArgs]
	s *Service
}

// NewSyncWorker returns a worker to bind to the service once it is built.
func NewSyncWorker() *SyncWorker { return &SyncWorker{} }

// Bind gives the worker the service whose jobs it runs.
func (w *SyncWorker) Bind(s *Service) { w.s = s }

func (w *SyncWorker) Work(ctx context.Context, job *river.Job[SyncArgs]) error {
	if w.s == nil {
		return errors.New("checkout: sync worker not bound to a service")
	}
	return w.s.sync(ctx, job.Args)
}

// sync reads the subscription from Stripe and applies it in a transaction of its own.
func (s *Service) sync(ctx context.Context, a SyncArgs) error {
	log := s.log.With("session_id", a.SessionID, "subscription_id", a.SubscriptionID)
	if a.Livemode != s.livemode {
		return river.JobCancel(fmt.Errorf("subscription %s is of the other mode than stripe.mode", a.SubscriptionID))
	}
	snap, err := s.readSubscription(ctx, a.SubscriptionID, "checkout:"+a.SessionID+":"+a.Source)
	if err != nil {
		if missing(err) {
			log.WarnContext(ctx, "subscription of a checkout session unknown to Stripe", stripeclient.LogAttr(err))
			return river.JobCancel(stripeclient.Redact(err))
		}
		return stripeclient.Redact(err)
	}
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		out, err := s.billing.ApplySnapshot(ctx, tx, *snap)
		if err != nil {
			return err
		}
		log.InfoContext(ctx, "subscription of a checkout session read from Stripe", "applied", out.SubscriptionApplied)
		return nil
	})
	if webhooks.IsPermanent(err) {
		log.WarnContext(ctx, "subscription of a checkout session cannot be applied", "error", err)
		return river.JobCancel(err)
	}
	return err
}

// readSubscription reads a subscription with its latest invoice from Stripe (the pinned API
// version) as a snapshot named source. A failed call's error wraps the *stripe.Error, unredacted:
// redact it before it is logged or kept.
func (s *Service) readSubscription(ctx context.Context, subscriptionID, source string) (*billing.Snapshot, error) {
	params := &stripe.SubscriptionParams{}
	params.Context = ctx
	params.AddExpand("latest_invoice")
	got, err := s.stripe.Subscriptions.Get(subscriptionID, params)
	if err != nil {
		return nil, fmt.Errorf("read subscription %s: %w", subscriptionID, err)
	}
	fetchedAt := s.now()
	if got.LastResponse == nil || len(got.LastResponse.RawJSON) == 0 {
		return nil, fmt.Errorf("read subscription %s: empty answer", subscriptionID)
	}
	raw := json.RawMessage(got.LastResponse.RawJSON)
	var top struct {
		Livemode      bool            `json:"livemode"`
		LatestInvoice json.RawMessage `json:"latest_invoice"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("read subscription %s: %w", subscriptionID, err)
	}
	snap := &billing.Snapshot{Livemode: top.Livemode, Subscription: raw, FetchedAt: fetchedAt, Source: source}
	if len(top.LatestInvoice) > 0 && top.LatestInvoice[0] == '{' {
		snap.LatestInvoice = top.LatestInvoice
	}
	return snap, nil
}

// missing reports whether Stripe answered that the object does not exist.
func missing(err error) bool {
	var se *stripe.Error
	return errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound
}
