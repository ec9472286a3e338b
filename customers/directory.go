package customers

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// Directory is the customers as the admin console finds and shows them: by user id, Stripe
// customer id, or a prefix of the email or name, one mode at a time.
type Directory struct{ db *gorm.DB }

// NewDirectory reads the customers of db.
func NewDirectory(db *gorm.DB) *Directory { return &Directory{db: db} }

// Person is a customer row as the console shows it, links still being made and customers
// deleted at Stripe included.
type Person struct {
	UserID           string     `gorm:"column:user_id"`
	StripeCustomerID *string    `gorm:"column:stripe_customer_id"`
	Email            string     `gorm:"column:email"`
	Name             string     `gorm:"column:name"`
	Livemode         bool       `gorm:"column:livemode"`
	CreatedAt        time.Time  `gorm:"column:created_at"`
	DeletedAt        *time.Time `gorm:"column:deleted_at"`
}

const personColumns = `user_id, stripe_customer_id, email, name, livemode, created_at, deleted_at`

// Person returns the user's customer row of the mode, nil when there is none.
func (d *Directory) Person(ctx context.Context, userID string, livemode bool) (*Person, error) {
	var rows []Person
	err := d.db.WithContext(ctx).Raw(`SELECT `+personColumns+` FROM customers WHERE user_id = $1 AND livemode = $2`,
		userID, livemode).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("load customer of user %q: %w", userID, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return &rows[0], nil
}

// Find returns the customers of the mode that text names: its user id or Stripe customer id
// exactly, or a prefix of their email or name, case-insensitive; ordered by email, then user id,
// at most limit.
//
// The prefix is an index range on lower(email) text_pattern_ops (and name): the bounds are
// computed in SQL from the parameter, so even a generic plan of the prepared statement keeps the
// range (a LIKE on a parameter would not); chr(1114111) is the largest character, above every
// continuation of the prefix.
func (d *Directory) Find(ctx context.Context, text string, livemode bool, limit int) ([]Person, error) {
	text = strings.TrimSpace(text)
	out := []Person{}
	if text == "" {
		return out, nil
	}
	err := d.db.WithContext(ctx).Raw(`
		SELECT `+personColumns+` FROM (
		  (SELECT `+personColumns+` FROM customers WHERE livemode = $1 AND (user_id = $2 OR stripe_customer_id = $2))
		  UNION
		  (SELECT `+personColumns+` FROM customers WHERE livemode = $1
		     AND lower(email) ~>=~ lower($2) AND lower(email) ~<~ (lower($2) || chr(1114111))
		   ORDER BY lower(email) LIMIT $3)
		  UNION
		  (SELECT `+personColumns+` FROM customers WHERE livemode = $1
		     AND lower(name) ~>=~ lower($2) AND lower(name) ~<~ (lower($2) || chr(1114111))
		   ORDER BY lower(name) LIMIT $3)
		) found
		ORDER BY lower(email), user_id LIMIT $3`, livemode, text, limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("find customers by %q: %w", text, err)
	}
	return out, nil
}
