package customers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/ids"
	"billing/internal/stripeclient"
)

// putExisting is PUT /v1/customers/{user_id} with {"stripe_customer_id": "cus_…"}: it links the
// user to a customer that exists at Stripe already (made in the Dashboard, by an earlier system)
// instead of making one.
func (h *Handlers) putExisting(c echo.Context, userID string, req putRequest) error {
	if req.Email != "" || req.Name != "" {
		return apierr.New(apierr.CodeInvalidRequest,
			"stripe_customer_id links an existing customer with its own email and name; send them in a later PUT")
	}
	if !strings.HasPrefix(req.StripeCustomerID, "cus_") || !ids.Valid(req.StripeCustomerID) {
		return apierr.New(apierr.CodeInvalidCustomerID, "stripe_customer_id must be a Stripe customer id (cus_…)")
	}
	// Once Stripe's metadata may be written, finish recording the link even if the client goes.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), httpserver.OutboundBudget)
	defer cancel()
	cust, created, err := h.LinkExisting(ctx, userID, req.StripeCustomerID)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, customerResponse{UserID: cust.UserID, StripeCustomerID: cust.StripeID(), Livemode: cust.Livemode})
}

// LinkExisting links userID to the existing Stripe customer customerID; created reports whether
// this call made the link (a repeat answers the link as it is, without calling Stripe). It refuses
// a customer that Stripe does not know or has deleted (404), one of the other mode, and one whose
// metadata.user_id, or whose local link, names another user (409 customer_belongs_to_other_user).
// A customer without metadata.user_id gets it, so that whoever reads the customer later (a
// reconciliation, a search past the key window) finds its user. Errors are *apierr.Error values.
func (h *Handlers) LinkExisting(ctx context.Context, userID, customerID string) (*Customer, bool, error) {
	mine, err := one(ctx, h.db, `SELECT * FROM customers WHERE user_id = $1 AND livemode = $2`, userID, h.livemode)
	if err != nil {
		return nil, false, database.APIError(err, "load customer link")
	}
	if mine != nil {
		if mine.StripeCustomerID != nil {
			if *mine.StripeCustomerID == customerID {
				return mine, false, nil
			}
			return nil, false, apierr.New(apierr.CodeConflict, "user %s is linked to another Stripe customer", userID).
				With("stripe_customer_id", *mine.StripeCustomerID)
		}
	}
	theirs, err := one(ctx, h.db, `SELECT * FROM customers WHERE stripe_customer_id = $1 AND livemode = $2`, customerID, h.livemode)
	if err != nil {
		return nil, false, database.APIError(err, "load customer link")
	}
	if theirs != nil {
		return nil, false, belongsToOther(customerID)
	}

	params := &stripe.CustomerParams{}
	params.Context = ctx
	sc, err := h.stripe.Customers.Get(customerID, params)
	var se *stripe.Error
	if errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound || err == nil && sc.Deleted {
		return nil, false, apierr.New(apierr.CodeNotFound, "Stripe has no customer %s", customerID).With("stripe_customer_id", customerID)
	}
	if err != nil {
		return nil, false, stripeclient.APIError(err, "read the customer")
	}
	if sc.Livemode != h.livemode {
		return nil, false, apierr.New(apierr.CodeLivemodeConflict, "customer %s is a %s-mode customer; this service runs in %s mode",
			customerID, modeWord(sc.Livemode), modeWord(h.livemode)).With("stripe_customer_id", customerID)
	}
	owner := sc.Metadata["user_id"]
	if owner != "" && owner != userID {
		return nil, false, belongsToOther(customerID)
	}

	cust := &Customer{UserID: userID, StripeCustomerID: &customerID, Email: sc.Email, Name: sc.Name, Livemode: h.livemode}
	err = h.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// The link is claimed first: of two users racing for one customer, the second waits on
		// the unique key and is refused, and only the winner's id is written to Stripe below. A
		// link still being made (a PUT's row without a customer) is finished with this customer.
		now := h.now().UTC()
		res := tx.Exec(`
			INSERT INTO customers AS c (user_id, stripe_customer_id, email, name, livemode, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $6)
			ON CONFLICT (user_id, livemode) DO UPDATE SET stripe_customer_id = EXCLUDED.stripe_customer_id, email = EXCLUDED.email,
				name = EXCLUDED.name, updated_at = EXCLUDED.updated_at
			WHERE c.stripe_customer_id IS NULL`,
			userID, customerID, sc.Email, sc.Name, h.livemode, now)
		if isUniqueViolation(res.Error) {
			return belongsToOther(customerID)
		}
		if res.Error != nil {
			return fmt.Errorf("link customer: %w", res.Error)
		}
		if res.RowsAffected == 0 {
			return linkChanged(userID)
		}
		if err := h.accounts.TellUser(ctx, tx, userID); err != nil {
			return err
		}
		if owner != "" {
			return nil
		}
		up := &stripe.CustomerParams{}
		up.Context = ctx
		up.AddMetadata("user_id", userID)
		if _, err := h.stripe.Customers.Update(customerID, up); err != nil {
			return stripeclient.APIError(err, "set the customer's user_id")
		}
		return nil
	})
	if err != nil {
		return nil, false, database.APIError(err, "link customer")
	}
	h.log.InfoContext(ctx, "existing stripe customer linked", "user_id", userID, "stripe_customer_id", customerID,
		"metadata_set", owner == "")
	return cust, true, nil
}

func belongsToOther(customerID string) error {
	return apierr.New(apierr.CodeCustomerBelongsToOtherUser, "Stripe customer %s belongs to another user", customerID).
		With("stripe_customer_id", customerID)
}

func modeWord(livemode bool) string {
	if livemode {
		return "live"
	}
	return "test"
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
