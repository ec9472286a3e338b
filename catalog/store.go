package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"billing/internal/database"
)

// Product is a product as the catalog keeps it.
type Product struct {
	ID          string
	Name        string
	Description *string
	Active      bool
	Created     time.Time
}

// Tier is one tier of a tiered price; UpTo nil is the last ("inf").
type Tier struct {
	UpTo       *int64 `json:"up_to"`
	UnitAmount *int64 `json:"unit_amount"`
	FlatAmount *int64 `json:"flat_amount"`
}

// Recurring is a recurring price's period and kind.
type Recurring struct {
	Interval      string  `json:"interval"`
	IntervalCount int64   `json:"interval_count"`
	UsageType     string  `json:"usage_type"`
	Meter         *string `json:"meter"`
}

// Price is a price as the catalog keeps it.
type Price struct {
	ID            string
	ProductID     string
	LookupKey     *string
	Nickname      *string
	Currency      string
	UnitAmount    *int64
	BillingScheme string
	TiersMode     *string
	Tiers         []Tier
	Recurring     *Recurring
	Active        bool
	Created       time.Time
}

// Write is where a product or price came from: an event (its id, created time and rank) or a
// read from Stripe (Source "reconcile:RUN", Created the fetch second, Rank readRank; see ReadWrite).
type Write struct {
	Source   string
	Created  time.Time
	Rank     int
	Livemode bool
	// Deleted: the object was deleted at Stripe; it stays, inactive.
	Deleted bool
}

// ReadWrite is the Write of an object read from Stripe at fetchedAt: it counts as an event of
// that second that loses the second's ties to real events.
func ReadWrite(source string, fetchedAt time.Time, livemode bool) Write {
	return Write{Source: source, Created: fetchedAt.UTC().Truncate(time.Second), Rank: readRank, Livemode: livemode}
}

// expandable is an id that Stripe may send expanded as an object.
type expandable string

func (e *expandable) UnmarshalJSON(b []byte) error {
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		var obj struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(b, &obj); err != nil {
			return err
		}
		*e = expandable(obj.ID)
		return nil
	}
	var s *string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if s != nil {
		*e = expandable(*s)
	}
	return nil
}

// maxText bounds what the catalog stores of Stripe's free text (Stripe's own limits are lower).
const maxText = 5000

func checkText(field, v string) error {
	if len(v) > maxText || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		return fmt.Errorf("%s is not text the catalog can keep", field)
	}
	return nil
}

// DecodeProduct reads a product object of the pinned API version.
func DecodeProduct(raw json.RawMessage) (Product, error) {
	var obj struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Name        string  `json:"name"`
		Description *string `json:"description"`
		Active      *bool   `json:"active"`
		Created     int64   `json:"created"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return Product{}, fmt.Errorf("product: %w", err)
	}
	switch {
	case obj.Object != "product":
		return Product{}, fmt.Errorf("object is %q, not a product", obj.Object)
	case !strings.HasPrefix(obj.ID, "prod_") || len(obj.ID) > 255:
		return Product{}, fmt.Errorf("product id %.40q is not a product id", obj.ID)
	case obj.Active == nil:
		return Product{}, fmt.Errorf("product %s has no active field", obj.ID)
	}
	if err := checkText("product name", obj.Name); err != nil {
		return Product{}, err
	}
	if obj.Description != nil {
		if err := checkText("product description", *obj.Description); err != nil {
			return Product{}, err
		}
	}
	return Product{ID: obj.ID, Name: obj.Name, Description: obj.Description, Active: *obj.Active,
		Created: time.Unix(obj.Created, 0).UTC()}, nil
}

// DecodePrice reads a price object of the pinned API version.
func DecodePrice(raw json.RawMessage) (Price, error) {
	var obj struct {
		ID            string     `json:"id"`
		Object        string     `json:"object"`
		Product       expandable `json:"product"`
		LookupKey     *string    `json:"lookup_key"`
		Nickname      *string    `json:"nickname"`
		Currency      string     `json:"currency"`
		UnitAmount    *int64     `json:"unit_amount"`
		BillingScheme string     `json:"billing_scheme"`
		TiersMode     *string    `json:"tiers_mode"`
		Tiers         []Tier     `json:"tiers"`
		Recurring     *Recurring `json:"recurring"`
		Active        *bool      `json:"active"`
		Created       int64      `json:"created"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return Price{}, fmt.Errorf("price: %w", err)
	}
	switch {
	case obj.Object != "price":
		return Price{}, fmt.Errorf("object is %q, not a price", obj.Object)
	case !strings.HasPrefix(obj.ID, "price_") && !strings.HasPrefix(obj.ID, "plan_") || len(obj.ID) > 255:
		return Price{}, fmt.Errorf("price id %.40q is not a price id", obj.ID)
	case obj.Product == "":
		return Price{}, fmt.Errorf("price %s names no product", obj.ID)
	case obj.Active == nil:
		return Price{}, fmt.Errorf("price %s has no active field", obj.ID)
	case len(obj.Currency) != 3:
		return Price{}, fmt.Errorf("price %s has currency %.10q", obj.ID, obj.Currency)
	}
	for _, t := range []*string{obj.LookupKey, obj.Nickname} {
		if t != nil {
			if err := checkText("price "+obj.ID+" text", *t); err != nil {
				return Price{}, err
			}
		}
	}
	if obj.BillingScheme == "" {
		obj.BillingScheme = "per_unit"
	}
	if obj.Recurring != nil && obj.Recurring.UsageType == "" {
		obj.Recurring.UsageType = "licensed"
	}
	return Price{ID: obj.ID, ProductID: string(obj.Product), LookupKey: obj.LookupKey, Nickname: obj.Nickname,
		Currency: strings.ToLower(obj.Currency), UnitAmount: obj.UnitAmount, BillingScheme: obj.BillingScheme,
		TiersMode: obj.TiersMode, Tiers: obj.Tiers, Recurring: obj.Recurring, Active: *obj.Active,
		Created: time.Unix(obj.Created, 0).UTC()}, nil
}

// newer is the ordering guard of a catalog row (aliased r) against the write's key in $n, $n+1,
// $n+2 (created, rank, source); a deleted row takes no write but its own deletion's.
func newer(n int) string {
	return fmt.Sprintf(`NOT r.deleted AND (r.event_created, r.event_rank, r.event_id COLLATE "C")
		< (CAST($%d AS timestamptz), CAST($%d AS integer), CAST($%d AS text) COLLATE "C")`, n, n+1, n+2)
}

// PutProduct writes p when its key is above the stored one, and reports whether it did. One
// statement: the row is created, or updated, or left as it is.
func (s *Service) PutProduct(ctx context.Context, tx *gorm.DB, p Product, w Write) (bool, error) {
	n, err := database.Exec(ctx, tx, `
		INSERT INTO catalog_products AS r (product_id, livemode, name, description, active, deleted, stripe_created,
		  event_id, event_created, event_rank, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $10, $8, $9, $11)
		ON CONFLICT (product_id, livemode) DO UPDATE SET
		  name = EXCLUDED.name, description = EXCLUDED.description, active = EXCLUDED.active,
		  deleted = EXCLUDED.deleted, stripe_created = EXCLUDED.stripe_created,
		  event_id = EXCLUDED.event_id, event_created = EXCLUDED.event_created, event_rank = EXCLUDED.event_rank,
		  updated_at = EXCLUDED.updated_at
		WHERE `+newer(8),
		p.ID, w.Livemode, p.Name, p.Description, p.Active && !w.Deleted, w.Deleted, p.Created, // $1–$7
		w.Created.UTC(), w.Rank, w.Source, s.now()) // $8–$11
	if err != nil {
		return false, fmt.Errorf("store product %s: %w", p.ID, err)
	}
	return n == 1, bumpVersion(ctx, tx, w.Livemode, n)
}

// PutPrice writes p when its key is above the stored one, and reports whether it did.
func (s *Service) PutPrice(ctx context.Context, tx *gorm.DB, p Price, w Write) (bool, error) {
	var tiers any
	if len(p.Tiers) > 0 {
		b, err := json.Marshal(p.Tiers)
		if err != nil {
			return false, err
		}
		tiers = string(b)
	}
	var interval, usage, meter *string
	var count *int64
	if r := p.Recurring; r != nil {
		interval, usage, meter, count = &r.Interval, &r.UsageType, r.Meter, &r.IntervalCount
	}
	n, err := database.Exec(ctx, tx, `
		INSERT INTO catalog_prices AS r (price_id, livemode, product_id, lookup_key, nickname, currency, unit_amount,
		  billing_scheme, tiers_mode, tiers, recurring_interval, recurring_interval_count, recurring_usage_type,
		  recurring_meter, active, deleted, stripe_created, event_created, event_rank, event_id, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, CAST($10 AS jsonb), $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)
		ON CONFLICT (price_id, livemode) DO UPDATE SET
		  product_id = EXCLUDED.product_id, lookup_key = EXCLUDED.lookup_key, nickname = EXCLUDED.nickname,
		  currency = EXCLUDED.currency, unit_amount = EXCLUDED.unit_amount, billing_scheme = EXCLUDED.billing_scheme,
		  tiers_mode = EXCLUDED.tiers_mode, tiers = EXCLUDED.tiers, recurring_interval = EXCLUDED.recurring_interval,
		  recurring_interval_count = EXCLUDED.recurring_interval_count, recurring_usage_type = EXCLUDED.recurring_usage_type,
		  recurring_meter = EXCLUDED.recurring_meter, active = EXCLUDED.active, deleted = EXCLUDED.deleted,
		  stripe_created = EXCLUDED.stripe_created, event_created = EXCLUDED.event_created,
		  event_rank = EXCLUDED.event_rank, event_id = EXCLUDED.event_id, updated_at = EXCLUDED.updated_at
		WHERE `+newer(18),
		p.ID, w.Livemode, p.ProductID, p.LookupKey, p.Nickname, p.Currency, p.UnitAmount, // $1–$7
		p.BillingScheme, p.TiersMode, tiers, interval, count, usage, meter, // $8–$14
		p.Active && !w.Deleted, w.Deleted, p.Created, w.Created.UTC(), w.Rank, w.Source, s.now()) // $15–$21
	if err != nil {
		return false, fmt.Errorf("store price %s: %w", p.ID, err)
	}
	return n == 1, bumpVersion(ctx, tx, w.Livemode, n)
}

// PutFeatures replaces a product's features with a list read from Stripe at readAt, when no
// later read is stored, and reports whether it did. A product the catalog does not know yet
// takes no features: its event comes, and queues a read of its own.
func (s *Service) PutFeatures(ctx context.Context, tx *gorm.DB, livemode bool, productID string, keys []string, readAt time.Time) (bool, error) {
	keys = slices.Clone(keys)
	for _, k := range keys {
		if err := checkText("feature lookup key", k); err != nil {
			return false, err
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if keys == nil {
		keys = []string{}
	}
	n, err := database.Exec(ctx, tx, `
		UPDATE catalog_products SET features = $3, features_read_at = $4, updated_at = $5
		WHERE product_id = $1 AND livemode = $2 AND (features_read_at IS NULL OR features_read_at < $4)`,
		productID, livemode, keys, readAt.UTC(), s.now())
	if err != nil {
		return false, fmt.Errorf("store the features of product %s: %w", productID, err)
	}
	return n == 1, bumpVersion(ctx, tx, livemode, n)
}

// bumpVersion moves the mode's catalog version on when a write changed a row (changed > 0), in
// the write's transaction: the copies of the answer made before it are then stale everywhere.
func bumpVersion(ctx context.Context, tx *gorm.DB, livemode bool, changed int64) error {
	if changed == 0 {
		return nil
	}
	if _, err := database.Exec(ctx, tx, `
		INSERT INTO catalog_versions AS v (livemode, version) VALUES ($1, 1)
		ON CONFLICT (livemode) DO UPDATE SET version = v.version + 1`, livemode); err != nil {
		return fmt.Errorf("move the catalog version on: %w", err)
	}
	return nil
}
