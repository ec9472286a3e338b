package entitlements

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/entitlements/activeentitlement"
	"gorm.io/gorm"

	"billing/billing"
	"billing/internal/jobs"
	"billing/internal/stripeclient"
	"billing/webhooks"
)

// Features: what the user may do. Stripe attaches features to products and tells a customer's
// active entitlements (the features of everything it subscribes to) by
// entitlements.active_entitlement_summary.updated, whose body lists at most a page of them. The
// local state keeps, per Stripe customer and mode, the lookup keys of that list
// (customer_features), and the entitlement answers them while the policy grants features
// (Policy.FeaturesGranted).
//
// The list is one column group with its own ordering guard, like the subscription's: an event
// replaces it only when its key (created, featureEventRank, event id) is above the stored one, so
// an older summary after a newer one changes nothing. When the event's list has more than it
// carries, a River job queued in the event's transaction (Stripe is never called inside it) reads
// every page of GET /v1/entitlements/active_entitlements and applies the whole list as a read: a
// read is fresher than every event created before its fetch or in the same second (the event that
// queued it among them), so it applies when nothing newer than its fetch second is stored, and
// stores its key with featureReadRank, above the events of that second. An event of that same
// second applied after the read cannot tell which came first: it is stale by the key, and queues
// a read of its own that settles it. Until the read lands, the list keeps what was granted before
// as well as what the event listed: a feature never flickers off for a paying customer while
// the rest of a long list is on its way.

// EventEntitlementSummaryUpdated is the event of a customer's active entitlements.
const EventEntitlementSummaryUpdated = string(stripe.EventTypeEntitlementsActiveEntitlementSummaryUpdated)

// Ranks of the feature group's keys: a read wins a tie with the events of its fetch second.
const (
	featureEventRank = 0
	featureReadRank  = 1
)

// ActiveEntitlementLister lists a customer's active entitlements at Stripe; the
// EntitlementsActiveEntitlements client of the API that internal/stripeclient builds implements it.
type ActiveEntitlementLister interface {
	List(params *stripe.EntitlementsActiveEntitlementListParams) *activeentitlement.Iter
}

// entitlementSummary is the part of an entitlements.active_entitlement_summary the service keeps.
type entitlementSummary struct {
	Object       string               `json:"object"`
	Customer     billing.ExpandableID `json:"customer"`
	Entitlements *struct {
		Data []struct {
			LookupKey string `json:"lookup_key"`
		} `json:"data"`
		HasMore bool `json:"has_more"`
	} `json:"entitlements"`
}

func decodeEntitlementSummary(raw json.RawMessage) (*entitlementSummary, []string, error) {
	var sum entitlementSummary
	if err := billing.DecodeObject(raw, &sum); err != nil {
		return nil, nil, err
	}
	switch {
	case sum.Object != "" && sum.Object != "entitlements.active_entitlement_summary":
		return nil, nil, fmt.Errorf("object is %q, not an active entitlement summary", sum.Object)
	case sum.Customer == "":
		return nil, nil, errors.New("active entitlement summary has no customer")
	case sum.Entitlements == nil:
		return nil, nil, fmt.Errorf("active entitlement summary of %s has no entitlements list", sum.Customer)
	}
	keys := make([]string, 0, len(sum.Entitlements.Data))
	for _, e := range sum.Entitlements.Data {
		keys = append(keys, e.LookupKey)
	}
	keys, err := normalizeLookupKeys(keys)
	if err != nil {
		return nil, nil, fmt.Errorf("active entitlement summary of %s: %w", sum.Customer, err)
	}
	return &sum, keys, nil
}

// maxLookupKey bounds a lookup key (Stripe's own limit is 80 characters).
const maxLookupKey = 200

// normalizeLookupKeys sorts the keys byte-wise and drops duplicates; a key that the database
// cannot store or no app would ask for (empty, too long, a NUL) is an error.
func normalizeLookupKeys(keys []string) ([]string, error) {
	for _, k := range keys {
		if k == "" || len(k) > maxLookupKey || strings.ContainsRune(k, 0) {
			return nil, fmt.Errorf("invalid feature lookup key %.40q", k)
		}
	}
	keys = slices.Clone(keys)
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// featureWrite is one replacement of a customer's list.
type featureWrite struct {
	customerID string
	livemode   bool
	keys       []string
	// complete: keys is the whole list; else it is kept together with the stored one.
	complete bool
	id, typ  string
	created  time.Time
	// read: the list was read from Stripe (the read's guard, featureReadRank); else an event's.
	read bool
}

// putFeatures writes w when its guard lets it, and reports whether it did. One statement: the
// row is created, or locked and updated, or left as it is.
func (s *Service) putFeatures(ctx context.Context, tx *gorm.DB, w featureWrite) (bool, error) {
	guard := `(f.feat_event_created, f.feat_event_rank, f.feat_event_id COLLATE "C")
		< (EXCLUDED.feat_event_created, EXCLUDED.feat_event_rank, EXCLUDED.feat_event_id COLLATE "C")`
	rank := featureEventRank
	if w.read {
		guard, rank = `f.feat_event_created <= EXCLUDED.feat_event_created`, featureReadRank
	}
	keys := w.keys
	if keys == nil {
		keys = []string{}
	}
	res := tx.WithContext(ctx).Exec(`
		INSERT INTO customer_features AS f (stripe_customer_id, livemode, lookup_keys, complete,
		  feat_event_id, feat_event_type, feat_event_created, feat_event_rank, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
		ON CONFLICT (stripe_customer_id, livemode) DO UPDATE SET
		  lookup_keys = CASE WHEN EXCLUDED.complete THEN EXCLUDED.lookup_keys
		    ELSE ARRAY(SELECT DISTINCT k COLLATE "C" FROM unnest(f.lookup_keys || EXCLUDED.lookup_keys) AS k ORDER BY 1) END,
		  complete = EXCLUDED.complete,
		  feat_event_id = EXCLUDED.feat_event_id,
		  feat_event_type = EXCLUDED.feat_event_type,
		  feat_event_created = EXCLUDED.feat_event_created,
		  feat_event_rank = EXCLUDED.feat_event_rank,
		  updated_at = EXCLUDED.updated_at
		WHERE `+guard,
		w.customerID, w.livemode, keys, w.complete, w.id, w.typ, w.created.UTC(), rank, s.now())
	if res.Error != nil {
		return false, fmt.Errorf("store the features of customer %s: %w", w.customerID, res.Error)
	}
	if res.RowsAffected != 1 {
		return false, nil
	}
	return true, s.tellCustomer(ctx, tx, w.customerID, w.livemode)
}

// handleEntitlementSummary applies entitlements.active_entitlement_summary.updated.
func (s *Service) handleEntitlementSummary(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	sum, keys, err := decodeEntitlementSummary(ev.Object)
	if err != nil {
		return webhooks.Permanent(fmt.Errorf("%s %s: %w", ev.Type, ev.ID, err))
	}
	// The row is the event's mode's own (customer_features is keyed by customer and mode): a
	// summary signed with one mode's secret never touches the other's world.
	customerID := string(sum.Customer)
	more := sum.Entitlements.HasMore
	applied, err := s.putFeatures(ctx, tx, featureWrite{customerID: customerID, livemode: ev.Livemode, keys: keys,
		complete: !more, id: ev.ID, typ: ev.Type, created: ev.Created})
	if err != nil {
		return err
	}
	outcome := "applied"
	readNeeded := applied && more
	if !applied {
		outcome = "stale"
		// Stale by the key, but of the same second as what is stored: Stripe's clock cannot say
		// which is newer, a read of Stripe can.
		cur, err := s.customerFeaturesTx(ctx, tx, customerID, ev.Livemode)
		if err != nil {
			return err
		}
		if cur.Found && cur.EventID != ev.ID && cur.EventCreated.Truncate(time.Second).Equal(ev.Created.UTC().Truncate(time.Second)) {
			readNeeded, outcome = true, "tie"
		}
	}
	s.billing.CountEvent(ev.Type, outcome)
	s.log.LogAttrs(ctx, slog.LevelInfo, "active entitlements event",
		slog.String("event_id", ev.ID), slog.String("stripe_customer_id", customerID),
		slog.Int("features", len(keys)), slog.Bool("has_more", more), slog.String("outcome", outcome))
	if !readNeeded {
		return nil
	}
	return s.queueFeaturesRead(ctx, tx, FeaturesReadArgs{
		StripeCustomerID: customerID, Livemode: ev.Livemode, EventID: ev.ID, EventCreated: ev.Created.Unix(),
	})
}

// FeatureRead is a customer's whole list of active entitlements as read from Stripe.
type FeatureRead struct {
	StripeCustomerID string
	Livemode         bool
	// LookupKeys are the features' lookup keys, in any order.
	LookupKeys []string
	// FetchedAt is when the read began (its first page was asked for).
	FetchedAt time.Time
	// After is the created time of the event that asked for the read (zero if none): the read
	// counts as no older than it, whatever the skew between Stripe's clock and ours.
	After time.Time
	// Source names the read where an event id would be ("features-read:EVENT", "reconcile:RUN").
	Source string
}

// ApplyFeatureRead applies a list read from Stripe inside tx, when nothing newer than the read
// is stored, and reports whether it did.
func (s *Service) ApplyFeatureRead(ctx context.Context, tx *gorm.DB, r FeatureRead) (bool, error) {
	keys, err := normalizeLookupKeys(r.LookupKeys)
	if err != nil {
		return false, webhooks.Permanent(fmt.Errorf("features of customer %s: %w", r.StripeCustomerID, err))
	}
	at := r.FetchedAt.UTC().Truncate(time.Second)
	if r.After.After(at) {
		at = r.After.UTC()
	}
	return s.putFeatures(ctx, tx, featureWrite{customerID: r.StripeCustomerID, livemode: r.Livemode, keys: keys,
		complete: true, id: r.Source, typ: featureReadType, created: at, read: true})
}

// CustomerFeatures is a customer's stored list.
type CustomerFeatures struct {
	// Found is false when nothing was ever stored for the customer (no features).
	Found      bool
	LookupKeys []string
	// Complete is false while the read of a long list is pending.
	Complete bool
	// EventID, EventType and EventCreated are the key stored with the list: an event's, or a
	// read's (EventType featureReadType, EventID naming the read).
	EventID      string
	EventType    string
	EventCreated time.Time
	UpdatedAt    time.Time
}

// FromRead reports whether the stored list came from a read of Stripe rather than an event.
func (f CustomerFeatures) FromRead() bool { return f.EventType == featureReadType }

// featureReadType is the type stored with a list read from Stripe.
const featureReadType = "read"

// CustomerFeatures returns the stored features of a Stripe customer of a mode.
func (s *Service) CustomerFeatures(ctx context.Context, stripeCustomerID string, livemode bool) (CustomerFeatures, error) {
	return s.customerFeaturesTx(ctx, s.db, stripeCustomerID, livemode)
}

func (s *Service) customerFeaturesTx(ctx context.Context, tx *gorm.DB, stripeCustomerID string, livemode bool) (CustomerFeatures, error) {
	if stripeCustomerID == "" {
		return CustomerFeatures{}, nil
	}
	m, err := customerFeaturesOf(ctx, tx, []string{stripeCustomerID}, livemode)
	if err != nil {
		return CustomerFeatures{}, fmt.Errorf("load the features of customer %s: %w", stripeCustomerID, err)
	}
	return m[stripeCustomerID], nil
}

// CustomerFeaturesOf returns the stored features of Stripe customers of a mode in one statement
// (reconcile compares a page's customers at once), by customer id; a customer with nothing
// stored is absent.
func (s *Service) CustomerFeaturesOf(ctx context.Context, stripeCustomerIDs []string, livemode bool) (map[string]CustomerFeatures, error) {
	m, err := customerFeaturesOf(ctx, s.db, stripeCustomerIDs, livemode)
	if err != nil {
		return nil, fmt.Errorf("load the features of %d customers: %w", len(stripeCustomerIDs), err)
	}
	return m, nil
}

func customerFeaturesOf(ctx context.Context, tx *gorm.DB, ids []string, livemode bool) (map[string]CustomerFeatures, error) {
	out := make(map[string]CustomerFeatures, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := tx.WithContext(ctx).Statement.ConnPool.QueryContext(ctx, `
		SELECT stripe_customer_id, lookup_keys, complete, feat_event_id, feat_event_type, feat_event_created, updated_at
		FROM customer_features WHERE stripe_customer_id = ANY($1) AND livemode = $2`, ids, livemode)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	types := pgtype.NewMap()
	for rows.Next() {
		var id string
		f := CustomerFeatures{Found: true}
		if err := rows.Scan(&id, types.SQLScanner(&f.LookupKeys), &f.Complete, &f.EventID, &f.EventType, &f.EventCreated, &f.UpdatedAt); err != nil {
			return nil, err
		}
		out[id] = f
	}
	return out, rows.Err()
}

// ListActiveEntitlements reads every page of a customer's active entitlements from Stripe and
// returns their lookup keys, with the time the read began.
func ListActiveEntitlements(ctx context.Context, lister ActiveEntitlementLister, customerID string, now func() time.Time) ([]string, time.Time, error) {
	fetchedAt := now()
	params := &stripe.EntitlementsActiveEntitlementListParams{Customer: stripe.String(customerID)}
	params.Context = ctx
	params.Limit = stripe.Int64(100)
	it := lister.List(params)
	var keys []string
	for it.Next() {
		keys = append(keys, it.EntitlementsActiveEntitlement().LookupKey)
	}
	if err := it.Err(); err != nil {
		return nil, fetchedAt, err
	}
	return keys, fetchedAt, nil
}

// FeaturesReadJobKind is the River kind of FeaturesReadArgs; queued jobs name it, so it never
// changes.
const FeaturesReadJobKind = "billing_features_read"

// FeaturesReadArgs is the River job that reads every page of a customer's active entitlements
// and applies them: one per event that asked for it.
type FeaturesReadArgs struct {
	StripeCustomerID string `json:"stripe_customer_id" river:"unique"`
	Livemode         bool   `json:"livemode" river:"unique"`
	EventID          string `json:"event_id" river:"unique"`
	// EventCreated is the event's created time (Unix seconds).
	EventCreated int64 `json:"event_created"`
}

func (FeaturesReadArgs) Kind() string { return FeaturesReadJobKind }

func (s *Service) queueFeaturesRead(ctx context.Context, tx *gorm.DB, args FeaturesReadArgs) error {
	if s.jobs == nil || s.stripe == nil {
		s.log.WarnContext(ctx, "active entitlements not read: no Stripe client to read them with",
			"stripe_customer_id", args.StripeCustomerID, "event_id", args.EventID)
		return nil
	}
	sqlTx, err := jobs.SQLTx(tx)
	if err != nil {
		return err
	}
	if _, err := s.jobs.InsertTx(ctx, sqlTx, args, &river.InsertOpts{
		MaxAttempts: s.read.MaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByArgs: true},
	}); err != nil {
		return fmt.Errorf("queue the read of the features of %s: %w", args.StripeCustomerID, err)
	}
	return nil
}

type featuresReadWorker struct {
	river.WorkerDefaults[FeaturesReadArgs]
	s *Service
}

func (w *featuresReadWorker) Work(ctx context.Context, job *river.Job[FeaturesReadArgs]) error {
	outcome, err := w.s.ReadFeatures(ctx, job.Args)
	if outcome != "" {
		w.s.featureReads.WithLabelValues(outcome).Inc()
	}
	return err
}

// NextRetry doubles the delay at each attempt, as billing's re-reads do.
func (w *featuresReadWorker) NextRetry(job *river.Job[FeaturesReadArgs]) time.Time {
	d := w.s.read.RetryDelay
	for i := 1; i < job.Attempt && d < billing.MaxRereadRetryDelay; i++ {
		d *= 2
	}
	return time.Now().Add(min(d, billing.MaxRereadRetryDelay))
}

// ReadFeatures runs one attempt of a FeaturesReadArgs job: it reads every page of the customer's
// active entitlements and applies them in a transaction of its own. It returns the outcome to
// count ("" while the job goes on) and the error that River acts on.
func (s *Service) ReadFeatures(ctx context.Context, a FeaturesReadArgs) (string, error) {
	log := s.log.With("stripe_customer_id", a.StripeCustomerID, "event_id", a.EventID)
	if s.stripe == nil {
		return "failed", river.JobCancel(errors.New("entitlements: no Stripe client to read active entitlements with"))
	}
	if a.Livemode != s.read.Livemode {
		log.WarnContext(ctx, "active entitlements not read: the customer belongs to the other Stripe mode than stripe.mode")
		return "skipped", nil
	}
	keys, fetchedAt, err := ListActiveEntitlements(ctx, s.stripe, a.StripeCustomerID, s.now)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) && (se.HTTPStatusCode == http.StatusNotFound || se.Code == stripe.ErrorCodeResourceMissing) {
			log.WarnContext(ctx, "active entitlements not read: Stripe does not know the customer", stripeclient.LogAttr(err))
			return "failed", river.JobCancel(stripeclient.Redact(err))
		}
		return "", fmt.Errorf("read the active entitlements of %s: %w", a.StripeCustomerID, stripeclient.Redact(err))
	}
	var applied bool
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		applied, err = s.ApplyFeatureRead(ctx, tx, FeatureRead{
			StripeCustomerID: a.StripeCustomerID, Livemode: a.Livemode, LookupKeys: keys, FetchedAt: fetchedAt,
			After: time.Unix(a.EventCreated, 0), Source: "features-read:" + a.EventID,
		})
		return err
	})
	if err != nil {
		if webhooks.IsPermanent(err) {
			log.WarnContext(ctx, "active entitlements read from Stripe cannot be applied", "error", err)
			return "failed", river.JobCancel(err)
		}
		return "", err
	}
	outcome := "applied"
	if !applied {
		outcome = "stale"
	}
	log.InfoContext(ctx, "active entitlements read from Stripe", "features", len(keys), "outcome", outcome)
	return outcome, nil
}
