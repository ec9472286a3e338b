package reconcile

import (
	"billing/customers"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/internal/ids"
)

// linkDrift is a customer link that differs.
type linkDrift struct {
	diff       diff
	repairable bool
	reason     string
}

// linkRow is a row of customers: a user's link, of either mode.
type linkRow struct {
	UserID           string  `gorm:"column:user_id"`
	StripeCustomerID *string `gorm:"column:stripe_customer_id"`
	Livemode         bool    `gorm:"column:livemode"`
}

// linkSet holds the customers rows of a page's users and customers, read in one query.
type linkSet struct {
	users, customers map[string]bool
	rows             []linkRow
}

// loadLinks reads the links of the users that the customers' metadata.user_id names, and of
// the customers themselves, in one query.
func (r *run) loadLinks(ctx context.Context, cs []*stripe.Customer) (*linkSet, error) {
	set := &linkSet{users: map[string]bool{}, customers: map[string]bool{}}
	for _, c := range cs {
		if c == nil || c.Deleted || !ids.Valid(c.Metadata["user_id"]) {
			continue
		}
		set.users[c.Metadata["user_id"]] = true
		set.customers[c.ID] = true
	}
	if len(set.users) == 0 {
		return set, nil
	}
	var err error
	set.rows, err = r.queryLinks(ctx, slices.Collect(maps.Keys(set.users)), slices.Collect(maps.Keys(set.customers)))
	if err != nil {
		return nil, fmt.Errorf("load the links of the page's customers: %w", err)
	}
	return set, nil
}

// queryLinks reads the rows of the users or the customers in the run's mode, ordered by user.
func (r *run) queryLinks(ctx context.Context, users, customers []string) ([]linkRow, error) {
	var rows []linkRow
	err := r.s.db.WithContext(ctx).Raw(
		`SELECT user_id, stripe_customer_id, livemode FROM customers
		WHERE livemode = $3 AND (user_id = ANY($1) OR stripe_customer_id = ANY($2)) ORDER BY user_id`,
		users, customers, r.s.livemode).Scan(&rows).Error
	return rows, err
}

// linksOf are the rows of the user or the customer, from the set when it holds both (else read:
// a re-read customer may name another user than the page did).
func (r *run) linksOf(ctx context.Context, set *linkSet, userID, customerID string) ([]linkRow, error) {
	if !set.users[userID] || !set.customers[customerID] {
		return r.queryLinks(ctx, []string{userID}, []string{customerID})
	}
	var out []linkRow
	for _, row := range set.rows {
		if row.UserID == userID || deref(row.StripeCustomerID) == customerID {
			out = append(out, row)
		}
	}
	return out, nil
}

// linkDiff checks that a customer whose metadata.user_id names a user is linked to that user in
// this mode. Nil when it is, or when the customer names no user.
func (r *run) linkDiff(ctx context.Context, c *stripe.Customer, links *linkSet) (*linkDrift, error) {
	if c == nil || c.Deleted || c.Metadata["user_id"] == "" {
		return nil, nil
	}
	userID := c.Metadata["user_id"]
	want := fmt.Sprintf("user %s → %s (%s)", userID, c.ID, modeName(r.s.livemode))
	if !ids.Valid(userID) {
		return &linkDrift{diff: diff{Field: FieldCustomerLink, Stripe: want},
			reason: "metadata.user_id is not a valid user id"}, nil
	}
	rows, err := r.linksOf(ctx, links, userID, c.ID)
	if err != nil {
		return nil, fmt.Errorf("load the link of customer %s: %w", c.ID, err)
	}
	if len(rows) == 0 {
		return &linkDrift{diff: diff{Field: FieldCustomerLink, Stripe: want}, repairable: true}, nil
	}
	if len(rows) == 1 && rows[0].UserID == userID && deref(rows[0].StripeCustomerID) == c.ID && rows[0].Livemode == r.s.livemode {
		return nil, nil
	}
	var local []string
	for _, row := range rows {
		cust := deref(row.StripeCustomerID)
		if cust == "" {
			cust = "a link still being made"
		}
		local = append(local, fmt.Sprintf("user %s → %s (%s)", row.UserID, cust, modeName(row.Livemode)))
	}
	return &linkDrift{diff: diff{Field: FieldCustomerLink, Local: strings.Join(local, "; "), Stripe: want},
		reason: "the user or the customer is linked otherwise; a link is never overwritten"}, nil
}

// link inserts the customer's link; a concurrent link of the user or the customer wins (the
// comparison after the repair reports it).
func (r *run) link(ctx context.Context, tx *gorm.DB, c *stripe.Customer) error {
	linked, err := customers.LinkFound(ctx, tx, c.Metadata["user_id"], c.ID, c.Email, c.Name, r.s.livemode, false, r.s.now())
	if err != nil || !linked {
		return err
	}
	if err := r.s.features.TellUser(ctx, tx, c.Metadata["user_id"]); err != nil {
		return err
	}
	r.s.log.InfoContext(ctx, "reconcile: customer linked", "run_id", r.sum.RunID, "user_id", c.Metadata["user_id"], "stripe_customer_id", c.ID)
	return nil
}
