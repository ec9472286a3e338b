package customers

import (
	"context"
	"errors"

	"billing/internal/database"
)

// EnsureLinked returns the user's linked customer, linking the user to a new Stripe customer
// first when there is none: the same row and key (customer-{user_id}) as PUT, so that a PUT and a
// Checkout for a new user never make two customers. The row is made without email or name
// (Checkout asks the customer for them); a link already being made keeps the values its PUT gave.
// Errors are *apierr.Error values.
func (h *Handlers) EnsureLinked(ctx context.Context, userID string) (*Customer, error) {
	cust, err := Get(ctx, h.db, userID, h.livemode)
	if err == nil {
		return cust, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, database.APIError(err, "load customer link")
	}
	now := h.now().UTC()
	if err := h.db.WithContext(ctx).Exec(`
		INSERT INTO customers (user_id, livemode, created_at, updated_at)
		VALUES ($1, $2, $3, $3)
		ON CONFLICT (user_id, livemode) DO NOTHING`,
		userID, h.livemode, now).Error; err != nil {
		return nil, database.APIError(err, "insert customer link")
	}
	cust, _, err = h.link(ctx, userID)
	return cust, err
}
