// Package catalog keeps what the app sells: Stripe's products, their prices and the features
// each product grants, per mode, so that the app's pricing page (GET /v1/prices) and the names it
// buys by (price lookup keys) are answered from local state, never by a call to Stripe.
//
// Stripe is the truth and its events are news of it: product.* and price.* events are applied
// under an ordering guard, as subscription events are (the older never overwrites the newer), and
// billing reconcile reads the whole catalog and applies what differs through the same writes. A
// product's features are not in its events: they are read from Stripe by a job that the product's
// event queues in its transaction, and by reconcile.
package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/productfeature"
	"gorm.io/gorm"

	"billing/internal/database"
	"billing/internal/jobs"
	"billing/webhooks"
)

// The catalog's event types (stripe-go v79's names).
const (
	EventProductCreated = string(stripe.EventTypeProductCreated)
	EventProductUpdated = string(stripe.EventTypeProductUpdated)
	EventProductDeleted = string(stripe.EventTypeProductDeleted)
	EventPriceCreated   = string(stripe.EventTypePriceCreated)
	EventPriceUpdated   = string(stripe.EventTypePriceUpdated)
	EventPriceDeleted   = string(stripe.EventTypePriceDeleted)
)

// FeatureLister lists a product's features at Stripe; the ProductFeatures client of the API that
// internal/stripeclient builds implements it.
type FeatureLister interface {
	List(params *stripe.ProductFeatureListParams) *productfeature.Iter
}

// Deps are what the catalog needs from main.
type Deps struct {
	DB *gorm.DB
	// Livemode is the deployment's world: the prices it lists and resolves. Events of both modes
	// are applied, each to its own world.
	Livemode bool
	// Features reads a product's features from Stripe (the deployment's mode only); nil reads
	// none (the features stay as reconcile last read them).
	Features FeatureLister
	// Jobs queues the features read in the event's transaction; nil queues none.
	Jobs   jobs.Inserter
	Logger *slog.Logger
	Now    func() time.Time
	// Registerer receives the catalog's metrics; optional.
	Registerer prometheus.Registerer
}

// Service applies the catalog's events and answers its reads.
type Service struct {
	db       *gorm.DB
	livemode bool
	features FeatureLister
	jobs     jobs.Inserter
	log      *slog.Logger
	now      func() time.Time

	// answers are GET /v1/prices's encoded answers at the catalog's version.
	answers answerCache
	events  *prometheus.CounterVec
}

// New builds the service. It panics on a wiring bug (no database).
func New(d Deps) *Service {
	if d.DB == nil {
		panic("catalog: Deps.DB is nil")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	s := &Service{db: d.DB, livemode: d.Livemode, features: d.Features, jobs: d.Jobs,
		log: d.Logger.With("component", "catalog"), now: d.Now,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_catalog_events_total",
			Help: "Product and price events handled, by type and outcome (applied, stale). Counted per attempt.",
		}, []string{"type", "outcome"}),
	}
	if d.Registerer != nil {
		d.Registerer.MustRegister(s.events)
	}
	return s
}

// Livemode is the deployment's mode.
func (s *Service) Livemode() bool { return s.livemode }

// Register registers the handlers of the product and price events.
func (s *Service) Register(reg *webhooks.Registry) {
	products := webhooks.HandlerFunc(s.handleProductEvent)
	prices := webhooks.HandlerFunc(s.handlePriceEvent)
	for _, t := range []string{EventProductCreated, EventProductUpdated, EventProductDeleted} {
		reg.Register(t, products)
	}
	for _, t := range []string{EventPriceCreated, EventPriceUpdated, EventPriceDeleted} {
		reg.Register(t, prices)
	}
}

// AddWorkers registers the features read's worker.
func (s *Service) AddWorkers(workers *river.Workers) {
	river.AddWorker(workers, &featuresReadWorker{s: s})
}

// Ranks of one second's writes: a read ranks below every event (Stripe's seconds cannot say
// whether the event came before or after it; the events of that second decide, a later read
// settles the rest), and within a second created < updated < deleted.
const (
	readRank = -1
)

func eventRank(typ string) int {
	switch typ {
	case EventProductUpdated, EventPriceUpdated:
		return 1
	case EventProductDeleted, EventPriceDeleted:
		return 2
	}
	return 0
}

// handleProductEvent applies a product.* event and queues the read of the product's features.
func (s *Service) handleProductEvent(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	w := Write{Source: ev.ID, Created: ev.Created, Rank: eventRank(ev.Type), Livemode: ev.Livemode,
		Deleted: ev.Type == EventProductDeleted}
	p, err := DecodeProduct(ev.Object)
	if err != nil {
		if id, ok := deletedStub(ev, "product"); ok {
			return s.markDeleted(ctx, tx, ev, "catalog_products", "product_id", id, w)
		}
		return webhooks.Permanent(err)
	}
	applied, err := s.PutProduct(ctx, tx, p, w)
	if err != nil {
		return err
	}
	s.count(ctx, ev, p.ID, applied)
	if !applied || w.Deleted {
		return nil
	}
	return s.queueFeaturesRead(ctx, tx, FeaturesReadArgs{ProductID: p.ID, Livemode: ev.Livemode})
}

// handlePriceEvent applies a price.* event.
func (s *Service) handlePriceEvent(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	w := Write{Source: ev.ID, Created: ev.Created, Rank: eventRank(ev.Type), Livemode: ev.Livemode,
		Deleted: ev.Type == EventPriceDeleted}
	p, err := DecodePrice(ev.Object)
	if err != nil {
		if id, ok := deletedStub(ev, "price"); ok {
			return s.markDeleted(ctx, tx, ev, "catalog_prices", "price_id", id, w)
		}
		return webhooks.Permanent(err)
	}
	applied, err := s.PutPrice(ctx, tx, p, w)
	if err != nil {
		return err
	}
	s.count(ctx, ev, p.ID, applied)
	return nil
}

// deletedStub is the id of a *.deleted event's object when it is the stub a deletion answers
// ({"id", "object", "deleted": true}) rather than the whole object: it still says the object is
// gone.
func deletedStub(ev webhooks.Event, object string) (string, bool) {
	if ev.Type != "product.deleted" && ev.Type != "price.deleted" {
		return "", false
	}
	var stub struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}
	if json.Unmarshal(ev.Object, &stub) != nil || !stub.Deleted || stub.Object != object || stub.ID == "" || len(stub.ID) > 255 {
		return "", false
	}
	return stub.ID, true
}

// markDeleted keeps a known row, inactive and deleted, under the ordering guard; a row the
// catalog never had stays unknown (there is nothing to sell or show of it).
func (s *Service) markDeleted(ctx context.Context, tx *gorm.DB, ev webhooks.Event, table, key, id string, w Write) error {
	n, err := database.Exec(ctx, tx, `UPDATE `+table+` AS r SET active = false, deleted = true,
		  event_created = $3, event_rank = $4, event_id = $5, updated_at = $6
		WHERE r.`+key+` = $1 AND r.livemode = $2 AND `+newer(3),
		id, w.Livemode, w.Created.UTC(), w.Rank, w.Source, s.now())
	if err != nil {
		return fmt.Errorf("mark %s %s deleted: %w", table, id, err)
	}
	if err := bumpVersion(ctx, tx, w.Livemode, n); err != nil {
		return err
	}
	s.count(ctx, ev, id, n == 1)
	return nil
}

func (s *Service) count(ctx context.Context, ev webhooks.Event, id string, applied bool) {
	outcome := "applied"
	if !applied {
		outcome = "stale"
	}
	s.events.WithLabelValues(ev.Type, outcome).Inc()
	s.log.LogAttrs(ctx, slog.LevelDebug, "catalog event", slog.String("event_id", ev.ID),
		slog.String("type", ev.Type), slog.String("object_id", id), slog.String("outcome", outcome))
}
