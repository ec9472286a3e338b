package catalog

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/internal/jobs"
	"billing/internal/stripeclient"
)

// FeaturesReadArgs is the job that reads a product's features from Stripe after its event.
type FeaturesReadArgs struct {
	ProductID string `json:"product_id" river:"unique"`
	Livemode  bool   `json:"livemode" river:"unique"`
}

func (FeaturesReadArgs) Kind() string { return "catalog_features_read" }

// featuresReadAttempts: a product's features matter to a pricing page, not to anyone's access
// (that is the customer's active entitlements, which billing reads); reconcile repairs the rest.
const featuresReadAttempts = 5

func (s *Service) queueFeaturesRead(ctx context.Context, tx *gorm.DB, args FeaturesReadArgs) error {
	if s.jobs == nil || s.features == nil || args.Livemode != s.livemode {
		// The other mode's products are read by that mode's deployment (or its reconcile).
		return nil
	}
	sqlTx, err := jobs.SQLTx(tx)
	if err != nil {
		return err
	}
	if _, err := s.jobs.InsertTx(ctx, sqlTx, args, &river.InsertOpts{
		MaxAttempts: featuresReadAttempts,
		// One read per product at a time: a burst of updates reads it once.
		UniqueOpts: river.UniqueOpts{ByArgs: true},
	}); err != nil {
		return fmt.Errorf("queue the read of the features of %s: %w", args.ProductID, err)
	}
	return nil
}

type featuresReadWorker struct {
	river.WorkerDefaults[FeaturesReadArgs]
	s *Service
}

func (w *featuresReadWorker) Work(ctx context.Context, job *river.Job[FeaturesReadArgs]) error {
	_, err := w.s.ReadFeatures(ctx, job.Args.ProductID)
	return err
}

// ReadFeatures reads every page of a product's features from Stripe and stores them, and reports
// whether they were stored (false: a later read was stored first, or the product is unknown).
func (s *Service) ReadFeatures(ctx context.Context, productID string) (bool, error) {
	if s.features == nil {
		return false, river.JobCancel(errors.New("catalog: no Stripe client to read product features with"))
	}
	keys, readAt, err := ListFeatures(ctx, s.features, productID, s.now)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound {
			s.log.WarnContext(ctx, "product features not read: Stripe does not know the product", "product_id", productID)
			return false, river.JobCancel(stripeclient.Redact(err))
		}
		return false, fmt.Errorf("read the features of product %s: %w", productID, stripeclient.Redact(err))
	}
	var stored bool
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		stored, err = s.PutFeatures(ctx, tx, s.livemode, productID, keys, readAt)
		return err
	})
	if err == nil {
		s.log.InfoContext(ctx, "product features read from Stripe", "product_id", productID, "features", len(keys), "stored", stored)
	}
	return stored, err
}

// ListFeatures lists every page of a product's features at Stripe: their lookup keys, and when
// the read began (what it is ordered by).
func ListFeatures(ctx context.Context, l FeatureLister, productID string, now func() time.Time) ([]string, time.Time, error) {
	readAt := now()
	params := &stripe.ProductFeatureListParams{Product: stripe.String(productID)}
	params.Context = ctx
	params.Limit = stripe.Int64(100)
	it := l.List(params)
	keys := []string{}
	for it.Next() {
		f := it.ProductFeature()
		if f.EntitlementFeature != nil && f.EntitlementFeature.LookupKey != "" {
			keys = append(keys, f.EntitlementFeature.LookupKey)
		}
	}
	return keys, readAt, it.Err()
}
