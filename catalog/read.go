package catalog

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"gorm.io/gorm"
)

// PriceView is a price as GET /v1/prices answers it: the price, its product's name and the
// features the product grants.
type PriceView struct {
	PriceID            string     `json:"price_id"`
	ProductID          string     `json:"product_id"`
	ProductName        *string    `json:"product_name"`
	ProductDescription *string    `json:"product_description"`
	LookupKey          *string    `json:"lookup_key"`
	Nickname           *string    `json:"nickname"`
	Currency           string     `json:"currency"`
	UnitAmount         *int64     `json:"unit_amount"`
	BillingScheme      string     `json:"billing_scheme"`
	TiersMode          *string    `json:"tiers_mode"`
	Tiers              []Tier     `json:"tiers"`
	Recurring          *Recurring `json:"recurring"`
	Features           []string   `json:"features"`
	// Active: the app may sell it now — the price is active, and its product is not archived.
	Active bool `json:"active"`
	// Deleted: deleted at Stripe (kept, inactive).
	Deleted bool `json:"deleted"`
}

// Filter narrows the list of prices; nil fields do not filter.
type Filter struct {
	Active    *bool
	ProductID *string
	LookupKey *string
}

// sellable is whether a price (p) of a product (pr, maybe not known yet) can be sold: a price
// whose product event has not arrived yet is judged by itself, and Stripe judges the rest.
const sellable = `(p.active AND NOT p.deleted AND coalesce(pr.active AND NOT pr.deleted, true))`

const priceViewColumns = `SELECT p.price_id, p.product_id, pr.name, pr.description, p.lookup_key, p.nickname,
	p.currency, p.unit_amount, p.billing_scheme, p.tiers_mode, p.tiers, p.recurring_interval,
	p.recurring_interval_count, p.recurring_usage_type, p.recurring_meter, coalesce(pr.features, '{}'),
	` + sellable + `, p.deleted
	FROM catalog_prices p
	LEFT JOIN catalog_products pr ON pr.product_id = p.product_id AND pr.livemode = p.livemode
	WHERE p.livemode = $1`

// Prices lists the deployment's prices that f selects, by product, then amount. Local state only.
func (s *Service) Prices(ctx context.Context, f Filter) ([]PriceView, error) {
	return listPrices(ctx, s.db, s.livemode, f)
}

func listPrices(ctx context.Context, db *gorm.DB, livemode bool, f Filter) ([]PriceView, error) {
	q := priceViewColumns + `
	  AND (CAST($2 AS boolean) IS NULL OR ` + sellable + ` = $2)
	  AND (CAST($3 AS text) IS NULL OR p.product_id = $3)
	  AND (CAST($4 AS text) IS NULL OR p.lookup_key = $4)
	ORDER BY p.product_id, p.unit_amount NULLS LAST, p.price_id`
	rows, err := db.WithContext(ctx).Statement.ConnPool.QueryContext(ctx, q, livemode, f.Active, f.ProductID, f.LookupKey)
	if err != nil {
		return nil, fmt.Errorf("list prices: %w", err)
	}
	return scanPrices(rows)
}

func scanPrices(rows *sql.Rows) ([]PriceView, error) {
	defer rows.Close()
	types := pgtype.NewMap()
	out := []PriceView{}
	for rows.Next() {
		var v PriceView
		var tiers []byte
		var interval, usage, meter sql.NullString
		var count sql.NullInt64
		if err := rows.Scan(&v.PriceID, &v.ProductID, &v.ProductName, &v.ProductDescription, &v.LookupKey, &v.Nickname,
			&v.Currency, &v.UnitAmount, &v.BillingScheme, &v.TiersMode, &tiers, &interval, &count, &usage, &meter,
			types.SQLScanner(&v.Features), &v.Active, &v.Deleted); err != nil {
			return nil, fmt.Errorf("list prices: %w", err)
		}
		if len(tiers) > 0 {
			if err := json.Unmarshal(tiers, &v.Tiers); err != nil {
				return nil, fmt.Errorf("price %s: tiers: %w", v.PriceID, err)
			}
		}
		if interval.Valid {
			v.Recurring = &Recurring{Interval: interval.String, IntervalCount: count.Int64, UsageType: usage.String}
			if meter.Valid {
				v.Recurring.Meter = &meter.String
			}
		}
		if v.Features == nil {
			v.Features = []string{}
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// ErrUnknownPrice: no price of the deployment's mode has that lookup key (or id).
var ErrUnknownPrice = errors.New("catalog: unknown price")

// ErrInactivePrice: the price exists but cannot be sold now (archived, or its product is).
var ErrInactivePrice = errors.New("catalog: inactive price")

// Resolve is the price a lookup key names: the sellable one, or ErrInactivePrice when only
// inactive prices have it, or ErrUnknownPrice. Stripe keeps a lookup key on one price at a time;
// while events of a transfer are on their way two may have it, and the sellable, newest wins.
func (s *Service) Resolve(ctx context.Context, lookupKey string) (PriceView, error) {
	return s.one(ctx, `p.lookup_key = $2`, lookupKey)
}

// Price is the price with that id, or ErrUnknownPrice when the catalog does not know it (it may
// still exist at Stripe: the catalog fills from events and reconcile), or ErrInactivePrice.
func (s *Service) Price(ctx context.Context, priceID string) (PriceView, error) {
	return s.one(ctx, `p.price_id = $2`, priceID)
}

func (s *Service) one(ctx context.Context, where string, arg string) (PriceView, error) {
	rows, err := s.db.WithContext(ctx).Statement.ConnPool.QueryContext(ctx, priceViewColumns+`
		AND `+where+`
		ORDER BY `+sellable+` DESC, p.stripe_created DESC NULLS LAST, p.price_id DESC LIMIT 1`, s.livemode, arg)
	if err != nil {
		return PriceView{}, fmt.Errorf("resolve price: %w", err)
	}
	vs, err := scanPrices(rows)
	switch {
	case err != nil:
		return PriceView{}, err
	case len(vs) == 0:
		return PriceView{}, ErrUnknownPrice
	case !vs[0].Active:
		return vs[0], ErrInactivePrice
	}
	return vs[0], nil
}

// ProductView is a product as the console and reconcile read it.
type ProductView struct {
	ProductID      string     `gorm:"column:product_id"`
	Name           string     `gorm:"column:name"`
	Description    *string    `gorm:"column:description"`
	Active         bool       `gorm:"column:active"`
	Deleted        bool       `gorm:"column:deleted"`
	Features       []string   `gorm:"-"`
	FeaturesReadAt *time.Time `gorm:"column:features_read_at"`
	EventID        string     `gorm:"column:event_id"`
	EventCreated   time.Time  `gorm:"column:event_created"`
	UpdatedAt      time.Time  `gorm:"column:updated_at"`
}

// Products lists a mode's products by name.
func (s *Service) Products(ctx context.Context, livemode bool) ([]ProductView, error) {
	rows, err := s.db.WithContext(ctx).Statement.ConnPool.QueryContext(ctx, `
		SELECT product_id, name, description, active, deleted, features, features_read_at, event_id, event_created, updated_at
		FROM catalog_products WHERE livemode = $1 ORDER BY name, product_id`, livemode)
	if err != nil {
		return nil, fmt.Errorf("list products: %w", err)
	}
	defer rows.Close()
	types := pgtype.NewMap()
	out := []ProductView{}
	for rows.Next() {
		var v ProductView
		if err := rows.Scan(&v.ProductID, &v.Name, &v.Description, &v.Active, &v.Deleted, types.SQLScanner(&v.Features),
			&v.FeaturesReadAt, &v.EventID, &v.EventCreated, &v.UpdatedAt); err != nil {
			return nil, fmt.Errorf("list products: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// AllPrices lists a mode's prices, every one (reconcile compares them, the console shows them).
func (s *Service) AllPrices(ctx context.Context, livemode bool) ([]PriceView, error) {
	return listPrices(ctx, s.db, livemode, Filter{})
}

// PriceNames maps price ids of the deployment's mode to a name a person reads ("Pro · month"),
// for the console's subscription pages; unknown ids are left out.
func (s *Service) PriceNames(ctx context.Context, livemode bool, priceIDs []string) (map[string]string, error) {
	out := map[string]string{}
	if len(priceIDs) == 0 {
		return out, nil
	}
	rows, err := s.db.WithContext(ctx).Statement.ConnPool.QueryContext(ctx, priceViewColumns+`
		AND p.price_id = ANY($2)`, livemode, priceIDs)
	if err != nil {
		return nil, fmt.Errorf("price names: %w", err)
	}
	vs, err := scanPrices(rows)
	if err != nil {
		return nil, err
	}
	for _, v := range vs {
		out[v.PriceID] = v.DisplayName()
	}
	return out, nil
}

// DisplayName is the price as a person names it: its product's name, its nickname or lookup key,
// and its period.
func (v PriceView) DisplayName() string {
	name := v.PriceID
	if v.ProductName != nil && *v.ProductName != "" {
		name = *v.ProductName
	}
	switch {
	case v.Nickname != nil && *v.Nickname != "":
		name += " · " + *v.Nickname
	case v.LookupKey != nil && *v.LookupKey != "":
		name += " · " + *v.LookupKey
	}
	if v.Recurring != nil {
		if v.Recurring.IntervalCount > 1 {
			name += fmt.Sprintf(" / %d %ss", v.Recurring.IntervalCount, v.Recurring.Interval)
		} else {
			name += " / " + v.Recurring.Interval
		}
	}
	return name
}
