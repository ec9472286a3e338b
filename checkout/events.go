package checkout

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"

	"billing/customers"
	"billing/internal/ids"
	"billing/webhooks"
)

// sessionObject is the part of a Checkout Session (API version 2024-06-20) the package reads, as
// an event carries it or the API answers it.
type sessionObject struct {
	ID                string            `json:"id"`
	Object            string            `json:"object"`
	Mode              string            `json:"mode"`
	Status            string            `json:"status"`
	PaymentStatus     string            `json:"payment_status"`
	ClientReferenceID string            `json:"client_reference_id"`
	Customer          expandableID      `json:"customer"`
	Subscription      expandableID      `json:"subscription"`
	Metadata          map[string]string `json:"metadata"`
	URL               string            `json:"url"`
	ExpiresAt         int64             `json:"expires_at"`
}

// expandableID is a Stripe reference: an id, the expanded object, or null.
type expandableID string

func (e *expandableID) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*e = ""
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*e = expandableID(s)
		return nil
	}
	var obj struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	*e = expandableID(obj.ID)
	return nil
}

func decodeSession(raw json.RawMessage) (*sessionObject, error) {
	var obj sessionObject
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("decode checkout session: %w", err)
	}
	if obj.ID == "" || (obj.Object != "" && obj.Object != "checkout.session") {
		return nil, fmt.Errorf("not a checkout session (object %q, id %q)", obj.Object, obj.ID)
	}
	return &obj, nil
}

// sessionState is the session's own fields as Stripe moves them: forward only.
type sessionState struct {
	SessionStatus  *string
	PaymentStatus  *string
	SubscriptionID *string
}

// merge keeps, field by field, the later stage of a and b: a session that is complete or expired
// never opens again, and a paid one is never unpaid again.
func (a sessionState) merge(b sessionState) sessionState {
	if final(a.SessionStatus, "complete", "expired") == final(b.SessionStatus, "complete", "expired") {
		a.SessionStatus = coalesce(a.SessionStatus, b.SessionStatus)
	} else if final(b.SessionStatus, "complete", "expired") {
		a.SessionStatus = b.SessionStatus
	}
	if final(a.PaymentStatus, "paid", "no_payment_required") == final(b.PaymentStatus, "paid", "no_payment_required") {
		a.PaymentStatus = coalesce(a.PaymentStatus, b.PaymentStatus)
	} else if final(b.PaymentStatus, "paid", "no_payment_required") {
		a.PaymentStatus = b.PaymentStatus
	}
	a.SubscriptionID = coalesce(a.SubscriptionID, b.SubscriptionID)
	return a
}

func final(p *string, finals ...string) bool {
	if p == nil {
		return false
	}
	for _, f := range finals {
		if *p == f {
			return true
		}
	}
	return false
}

func coalesce(a, b *string) *string {
	if a != nil {
		return a
	}
	return b
}

// handleSessionEvent applies checkout.session.completed, async_payment_succeeded,
// async_payment_failed and expired: it records the session, links its customer to the user when
// that link is missing, and queues the read of its subscription, all in the event's transaction.
// An expired session has no subscription: only its status is recorded (final, like complete).
// Stripe is not called here (webhooks.Handler); the job reads the subscription once the event is
// committed.
func (s *Service) handleSessionEvent(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
	obj, err := decodeSession(ev.Object)
	if err != nil {
		return webhooks.Permanent(fmt.Errorf("%s %s: %w", ev.Type, ev.ID, err))
	}
	if obj.Mode != "subscription" {
		// Payments and setups in Checkout are not this service's.
		s.log.InfoContext(ctx, "checkout session ignored: not a subscription", "event_id", ev.ID, "session_id", obj.ID, "mode", obj.Mode)
		return nil
	}
	row, err := s.recordSession(ctx, tx, ev.Livemode, obj)
	if err != nil {
		return fmt.Errorf("%s %s: %w", ev.Type, ev.ID, err)
	}
	if row.SubscriptionID == nil {
		return nil
	}
	if ev.Livemode != s.livemode {
		// The service's key cannot read the other mode's subscription; its own events bring it.
		s.log.InfoContext(ctx, "subscription of a checkout session of the other mode is not read",
			"event_id", ev.ID, "session_id", obj.ID, "livemode", ev.Livemode)
		return nil
	}
	return s.queueSync(ctx, tx, SyncArgs{
		SessionID: obj.ID, SubscriptionID: *row.SubscriptionID, Livemode: ev.Livemode, Source: ev.ID,
	})
}

// recordSession records Stripe's session object in tx (inserted, or merged into the row already
// there) and links its customer to its user when that link is missing. It returns the row.
func (s *Service) recordSession(ctx context.Context, tx *gorm.DB, livemode bool, obj *sessionObject) (*sessionRow, error) {
	userID, err := s.userOf(ctx, tx, obj, livemode)
	if err != nil {
		return nil, err
	}
	var expiresAt *time.Time
	if obj.ExpiresAt > 0 {
		t := time.Unix(obj.ExpiresAt, 0).UTC()
		expiresAt = &t
	}
	now := s.now().UTC()
	var rows []sessionRow
	err = tx.WithContext(ctx).Raw(`
		INSERT INTO checkout_sessions AS cs (livemode, user_id, stripe_customer_id, state, session_id, session_status,
			payment_status, subscription_id, url, expires_at, created_at, updated_at, completed_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, $11)
		ON CONFLICT (session_id, livemode) DO UPDATE SET
		  user_id = coalesce(cs.user_id, EXCLUDED.user_id),
		  stripe_customer_id = coalesce(cs.stripe_customer_id, EXCLUDED.stripe_customer_id),
		  session_status = CASE WHEN cs.session_status IN ('complete', 'expired') THEN cs.session_status
		                        ELSE coalesce(EXCLUDED.session_status, cs.session_status) END,
		  payment_status = CASE WHEN cs.payment_status IN ('paid', 'no_payment_required') THEN cs.payment_status
		                        ELSE coalesce(EXCLUDED.payment_status, cs.payment_status) END,
		  subscription_id = coalesce(cs.subscription_id, EXCLUDED.subscription_id),
		  url = coalesce(cs.url, EXCLUDED.url),
		  expires_at = coalesce(cs.expires_at, EXCLUDED.expires_at),
		  updated_at = EXCLUDED.updated_at
		RETURNING *`,
		livemode, nullString(userID), nullString(string(obj.Customer)), stateCompleted, obj.ID, nullString(obj.Status),
		nullString(obj.PaymentStatus), nullString(string(obj.Subscription)), nullString(obj.URL), expiresAt, now).
		Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("record checkout session %s: %w", obj.ID, err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("record checkout session %s: the upsert returned no row", obj.ID)
	}
	row := &rows[0]
	if row.UserID != nil && obj.Customer != "" {
		if err := s.linkCustomer(ctx, tx, *row.UserID, string(obj.Customer), livemode); err != nil {
			return nil, err
		}
	}
	return row, nil
}

// userOf names the session's user: client_reference_id (set by this service), else the
// metadata's user_id, else the user linked to the session's customer; "" when none is known.
func (s *Service) userOf(ctx context.Context, tx *gorm.DB, obj *sessionObject, livemode bool) (string, error) {
	for _, u := range []string{obj.ClientReferenceID, obj.Metadata["user_id"]} {
		if ids.Valid(u) {
			return u, nil
		}
	}
	if obj.Customer == "" {
		return "", nil
	}
	var users []string
	if err := tx.WithContext(ctx).Raw(`SELECT user_id FROM customers WHERE stripe_customer_id = $1 AND livemode = $2`,
		string(obj.Customer), livemode).Scan(&users).Error; err != nil {
		return "", fmt.Errorf("load user of customer %s: %w", obj.Customer, err)
	}
	if len(users) == 0 {
		return "", nil
	}
	return users[0], nil
}

// linkCustomer links userID to the Stripe customer that paid in Checkout when the user has no
// customer yet (or only a link still being made, which this one finishes: the customer exists).
// A customer already linked, to this user or another, and a user linked to another customer are
// left as they are: Stripe's session does not overrule a link. The link belongs to the event's
// world (livemode): a session of the other mode than the deployment's links the user there only,
// where no answer of this deployment looks.
func (s *Service) linkCustomer(ctx context.Context, tx *gorm.DB, userID, customerID string, livemode bool) error {
	var linked []struct {
		UserID string `gorm:"column:user_id"`
	}
	if err := tx.WithContext(ctx).Raw(`SELECT user_id FROM customers WHERE stripe_customer_id = $1 AND livemode = $2`, customerID, livemode).
		Scan(&linked).Error; err != nil {
		return fmt.Errorf("load link of customer %s: %w", customerID, err)
	}
	if len(linked) > 0 {
		if linked[0].UserID != userID {
			s.log.WarnContext(ctx, "checkout session names another user than the one linked to its customer; link kept",
				"stripe_customer_id", customerID, "session_user_id", userID, "linked_user_id", linked[0].UserID)
		}
		return nil
	}
	made, err := customers.LinkFound(ctx, tx, userID, customerID, "", "", livemode, true, s.now())
	if err != nil {
		return err
	}
	if !made {
		s.log.WarnContext(ctx, "checkout session's customer not linked: the user is linked to another customer",
			"user_id", userID, "stripe_customer_id", customerID)
		return nil
	}
	s.log.InfoContext(ctx, "stripe customer linked from checkout", "user_id", userID, "stripe_customer_id", customerID)
	return s.ents.TellUser(ctx, tx, userID)
}
