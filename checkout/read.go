package checkout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/billing"
	"billing/entitlements"
	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/ids"
	"billing/internal/stripeclient"
)

// sessionView is GET /v1/checkout-sessions/{id}.
type sessionView struct {
	ID             string                   `json:"id"`
	Status         *string                  `json:"status"`
	PaymentStatus  *string                  `json:"payment_status"`
	UserID         *string                  `json:"user_id"`
	SubscriptionID *string                  `json:"subscription_id"`
	Entitlement    entitlements.Entitlement `json:"entitlement"`
}

// getSession serves the success page: the session and the user's entitlement from local state.
// While the local state does not know the session's end (no row, or a row still open because
// the event has not come yet), the session is read from Stripe once and recorded, and a complete
// session's subscription is read and applied at once: the customer who is back from Checkout
// before the webhook is entitled by the time the page asks.
func (s *Service) getSession(c echo.Context) error {
	id := c.Param("session_id")
	if !ids.Valid(id) || !strings.HasPrefix(id, "cs_") {
		return apierr.New(apierr.CodeInvalidRequest, "the id must be a Checkout session id (cs_…)")
	}
	ctx := c.Request().Context()
	row, err := s.loadSession(ctx, s.db, id)
	if err != nil {
		return err
	}
	if row == nil || !final(row.SessionStatus, "complete", "expired") {
		read, err := s.readSession(ctx, id)
		switch {
		case err == nil:
			row = read
		case row != nil:
			// What is known locally is still an answer; the page asks again.
			s.log.WarnContext(ctx, "checkout session could not be read from Stripe; answering from local state",
				"session_id", id, "error", err)
		default:
			return err
		}
	}
	v := sessionView{ID: id, Status: row.SessionStatus, PaymentStatus: row.PaymentStatus, UserID: row.UserID, SubscriptionID: row.SubscriptionID}
	// features is never null in an entitlement, also when there is no user to grant any.
	v.Entitlement.Features = []string{}
	if row.UserID != nil {
		e, err := s.ents.Entitlement(ctx, *row.UserID)
		switch {
		case errors.Is(err, entitlements.ErrNoCustomer):
			v.Entitlement = entitlements.Entitlement{UserID: *row.UserID, Status: billing.StatusNone, Features: []string{}}
		case err != nil:
			return database.APIError(err, "load entitlement")
		default:
			v.Entitlement = *e
		}
	}
	return c.JSON(http.StatusOK, v)
}

func (s *Service) loadSession(ctx context.Context, db *gorm.DB, sessionID string) (*sessionRow, error) {
	var rows []sessionRow
	if err := db.WithContext(ctx).Raw(`SELECT * FROM checkout_sessions WHERE session_id = $1 AND livemode = $2`, sessionID, s.livemode).Scan(&rows).Error; err != nil {
		return nil, database.APIError(err, "load checkout session")
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return &rows[0], nil
}

// readSession reads a session from Stripe and records it; a complete one's subscription is read
// too and applied in the same transaction, or queued when Stripe does not answer for it.
func (s *Service) readSession(ctx context.Context, id string) (*sessionRow, error) {
	params := &stripe.CheckoutSessionParams{}
	params.Context = ctx
	cs, err := s.stripe.CheckoutSessions.Get(id, params)
	if missing(err) {
		return nil, apierr.New(apierr.CodeNotFound, "Stripe knows no Checkout session %s", id)
	}
	if err != nil {
		return nil, stripeclient.APIError(err, "read the Checkout session")
	}
	if cs.LastResponse == nil || len(cs.LastResponse.RawJSON) == 0 {
		return nil, apierr.Internal(fmt.Errorf("read checkout session %s: empty answer", id))
	}
	obj, err := decodeSession(json.RawMessage(cs.LastResponse.RawJSON))
	if err != nil {
		return nil, apierr.Internal(fmt.Errorf("read checkout session %s: %w", id, err))
	}
	if obj.Mode != "subscription" {
		return nil, apierr.New(apierr.CodeNotFound, "Checkout session %s is not a subscription's", id)
	}

	var snap *billing.Snapshot
	if obj.Status == "complete" && obj.Subscription != "" {
		snap, err = s.readSubscription(ctx, string(obj.Subscription), "checkout:"+id+":read")
		if err != nil {
			s.log.WarnContext(ctx, "subscription of a complete checkout session could not be read; queued",
				"session_id", id, "subscription_id", string(obj.Subscription), stripeclient.LogAttr(err))
		}
	}
	var row *sessionRow
	// The key's mode: Stripe answered with the service's key, so the session is of its mode.
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if row, err = s.recordSession(ctx, tx, s.livemode, obj); err != nil {
			return err
		}
		switch {
		case snap != nil:
			_, err = s.billing.ApplySnapshot(ctx, tx, *snap)
		case row.SubscriptionID != nil && obj.Status == "complete":
			err = s.queueSync(ctx, tx, SyncArgs{SessionID: id, SubscriptionID: *row.SubscriptionID, Livemode: s.livemode, Source: "read"})
		}
		return err
	})
	if err != nil {
		return nil, database.APIError(err, "record checkout session")
	}
	s.log.InfoContext(ctx, "checkout session read from Stripe", "session_id", id, "status", obj.Status,
		"subscription_applied", snap != nil)
	return row, nil
}
