package customers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"billing/webhooks"
)

// The customer's own events. customer.updated brings the email and name that notices are sent
// to; customer.deleted ends the link (Stripe's own subscription events cancel the
// subscriptions). Both apply inside the event's transaction, to the link of the event's mode only.
const (
	EventCustomerUpdated = "customer.updated"
	EventCustomerDeleted = "customer.deleted"
)

// Register registers the handlers of customer.updated and customer.deleted.
func Register(reg *webhooks.Registry) {
	reg.Register(EventCustomerUpdated, webhooks.HandlerFunc(handleCustomerUpdated))
	reg.Register(EventCustomerDeleted, webhooks.HandlerFunc(handleCustomerDeleted))
}

// Ordering: like the subscription groups, an update is applied only when its key (event created,
// rank, event id byte-wise) is above the one stored with the link, so an older customer.updated
// delivered late never overwrites a newer one. A PUT that changes email or name moves the stored
// time to its own, so that an event from before the PUT does not undo it. customer.deleted ranks
// above updated in a tie, and is final: it applies whatever the stored key, and nothing applies
// after it.
const (
	rankUpdated = 0
	rankDeleted = 1
)

// customerObject is the part of a Stripe customer the link keeps.
type customerObject struct {
	ID    string  `json:"id"`
	Email *string `json:"email"`
	Name  *string `json:"name"`
}

func decodeCustomer(raw json.RawMessage) (*customerObject, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, errors.New("data.object is not a JSON object")
	}
	var c customerObject
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("decode data.object: %w", err)
	}
	if c.ID == "" {
		return nil, errors.New("customer has no id")
	}
	return &c, nil
}

// lockLink locks the link of a Stripe customer id in the event's world. found is false when no
// user is linked to the customer there (an event about a customer made elsewhere, or a link of
// the other mode's world, which an event of this mode never touches): nothing to apply.
func lockLink(ctx context.Context, tx *gorm.DB, ev webhooks.Event, stripeCustomerID string) (found bool, err error) {
	var n []int
	if err := tx.WithContext(ctx).Raw(`SELECT 1 FROM customers WHERE stripe_customer_id = $1 AND livemode = $2 `+webhooks.LockRows(ctx),
		stripeCustomerID, ev.Livemode).Scan(&n).Error; err != nil {
		return false, fmt.Errorf("lock customer %s: %w", stripeCustomerID, err)
	}
	return len(n) > 0, nil
}

func handleCustomerUpdated(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	c, err := decodeCustomer(ev.Object)
	if err != nil {
		return webhooks.Permanent(fmt.Errorf("%s %s: %w", ev.Type, ev.ID, err))
	}
	if found, err := lockLink(ctx, tx, ev, c.ID); err != nil || !found {
		return err
	}
	// Stripe sends null for a customer without email or name; the columns keep "" for none.
	err = tx.WithContext(ctx).Exec(`
		UPDATE customers SET email = $3, name = $4, cus_event_id = $5, cus_event_created = $6, cus_event_rank = $7, updated_at = now()
		WHERE stripe_customer_id = $1 AND livemode = $2 AND deleted_at IS NULL
		  AND (cus_event_created IS NULL
		       OR (cus_event_created, cus_event_rank, cus_event_id COLLATE "C")
		          < (CAST($6 AS timestamptz), CAST($7 AS integer), CAST($5 AS text) COLLATE "C"))`,
		c.ID, ev.Livemode, deref(c.Email), deref(c.Name), ev.ID, ev.Created.UTC(), rankUpdated).Error
	if err != nil {
		return fmt.Errorf("apply %s %s to customer %s: %w", ev.Type, ev.ID, c.ID, err)
	}
	return nil
}

func handleCustomerDeleted(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	c, err := decodeCustomer(ev.Object)
	if err != nil {
		return webhooks.Permanent(fmt.Errorf("%s %s: %w", ev.Type, ev.ID, err))
	}
	if found, err := lockLink(ctx, tx, ev, c.ID); err != nil || !found {
		return err
	}
	err = tx.WithContext(ctx).Exec(`
		UPDATE customers SET deleted_at = $3, cus_event_id = $4, cus_event_created = $3, cus_event_rank = $5, updated_at = now()
		WHERE stripe_customer_id = $1 AND livemode = $2 AND deleted_at IS NULL`,
		c.ID, ev.Livemode, ev.Created.UTC(), ev.ID, rankDeleted).Error
	if err != nil {
		return fmt.Errorf("apply %s %s to customer %s: %w", ev.Type, ev.ID, c.ID, err)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
