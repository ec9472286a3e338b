package customers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
	"gorm.io/gorm"

	"billing/billing"
	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/ids"
	"billing/internal/stripeclient"
)

// keyWindow is how long we trust Stripe to still remember an idempotency key. Stripe keeps keys
// for at least 24 hours after their first use; the link row is written before that first use, so
// its age bounds the key's age from above, and the hour of margin covers clock skew and the
// duration of the call itself.
const keyWindow = 23 * time.Hour

// Accounts is the billing side of GET /v1/customers/{user_id}: the user's subscriptions and
// entitlement, read from local state (billing.Service implements it).
type Accounts interface {
	Customer(ctx context.Context, userID string) (*billing.CustomerView, error)
}

// Deps are what the customers endpoints need from main.
type Deps struct {
	DB       *gorm.DB
	Accounts Accounts
	Stripe   *client.API
	Livemode bool
	Logger   *slog.Logger
	Now      func() time.Time
}

// Handlers serves PUT and GET /v1/customers/{user_id}.
type Handlers struct {
	db       *gorm.DB
	accounts Accounts
	stripe   *client.API
	livemode bool
	log      *slog.Logger
	now      func() time.Time
}

// NewHandlers returns the customers endpoint. Logger and Now default to a discarding logger and
// time.Now.
func NewHandlers(d Deps) *Handlers {
	h := &Handlers{db: d.DB, accounts: d.Accounts, stripe: d.Stripe, livemode: d.Livemode, log: d.Logger, now: d.Now}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.log = h.log.With("component", "customers")
	return h
}

// Mount adds the routes to v1, the /v1 group behind the app backend's authentication.
func (h *Handlers) Mount(v1 *echo.Group) {
	v1.PUT("/customers/:user_id", h.put)
	v1.GET("/customers/:user_id", h.get)
}

// get answers the user's link with its subscriptions and entitlement, from local state only.
func (h *Handlers) get(c echo.Context) error {
	userID := c.Param("user_id")
	if err := ids.CheckUser(userID); err != nil {
		return err
	}
	v, err := h.accounts.Customer(c.Request().Context(), userID)
	if errors.Is(err, billing.ErrNoCustomer) {
		return apierr.New(apierr.CodeNotFound, "no customer for user %q", userID)
	}
	if err != nil {
		return database.APIError(err, "load customer "+userID)
	}
	return c.JSON(http.StatusOK, v)
}

type putRequest struct {
	Email string `json:"email"`
	Name  string `json:"name"`
}

type customerResponse struct {
	UserID           string `json:"user_id"`
	StripeCustomerID string `json:"stripe_customer_id"`
	Livemode         bool   `json:"livemode"`
}

func (h *Handlers) put(c echo.Context) error {
	userID := c.Param("user_id")
	if err := ids.CheckUser(userID); err != nil {
		return err
	}
	var req putRequest
	if err := httpserver.DecodeJSON(c, &req, false); err != nil {
		return err
	}
	if err := checkEmail(req.Email); err != nil {
		return err
	}
	if err := checkName(req.Name); err != nil {
		return err
	}
	// Once the link is being made, finish recording it even if the client goes away: Stripe may
	// already have created the customer.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), httpserver.OutboundBudget)
	defer cancel()
	cust, created, err := h.Ensure(ctx, userID, req.Email, req.Name)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, customerResponse{UserID: cust.UserID, StripeCustomerID: cust.StripeID(), Livemode: cust.Livemode})
}

// Ensure links userID to a Stripe customer, creating it on first use, and brings email and name
// up to date locally and on Stripe. created reports whether this call made the link. Errors are
// *apierr.Error values.
//
// The row is inserted (committed) before Stripe is called, and the Stripe customer is created
// with the first request's email and name under the key customer-{user_id}: a retry after a crash
// sends the very same parameters with the same key, so Stripe answers with the customer it
// already made. A create that Stripe refuses outright leaves nothing under the key, so the
// unfinished row is dropped and the next PUT starts over with its own values. Concurrent calls
// for one user queue on the row lock, held across the Stripe call (it is per user, and the call
// is short).
func (h *Handlers) Ensure(ctx context.Context, userID, email, name string) (*Customer, bool, error) {
	now := h.now().UTC()
	err := h.db.WithContext(ctx).Exec(`
		INSERT INTO customers (user_id, email, name, livemode, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (user_id) DO NOTHING`,
		userID, email, name, h.livemode, now, now).Error
	if err != nil {
		return nil, false, database.APIError(err, "insert customer link")
	}

	var (
		cust      Customer
		created   bool
		updateErr error
	)
	err = h.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Raw(`SELECT * FROM customers WHERE user_id = ? FOR UPDATE`, userID).Scan(&cust)
		if res.Error != nil {
			return database.APIError(res.Error, "lock customer link")
		}
		if res.RowsAffected == 0 {
			// Dropped by a concurrent request whose create Stripe refused, while we waited.
			return apierr.New(apierr.CodeConflict, "the customer link of user %s changed meanwhile; repeat the request", userID)
		}
		if cust.Livemode != h.livemode {
			// Linked (or being linked) in the other mode: neither finish it with this mode's key
			// nor move it over.
			return ModeConflict(userID, cust.Livemode)
		}
		if cust.StripeCustomerID == nil {
			id, err := h.findOrCreate(ctx, &cust)
			var refused createRefused
			if errors.As(err, &refused) {
				// Nothing exists under the key, so the unfinished link is dropped and the next
				// PUT starts over with its own values. Kept, it would make every later PUT resend
				// the refused ones, forever.
				if err := tx.Exec(`DELETE FROM customers WHERE user_id = ? AND stripe_customer_id IS NULL`, userID).Error; err != nil {
					return database.APIError(err, "drop refused customer link")
				}
				updateErr = refused.answer
				return nil
			}
			if err != nil {
				return err
			}
			if err := tx.Exec(`UPDATE customers SET stripe_customer_id = ?, updated_at = ? WHERE user_id = ?`,
				id, h.now().UTC(), userID).Error; err != nil {
				return database.APIError(err, "store Stripe customer id")
			}
			cust.StripeCustomerID = &id
			created = true
			h.log.InfoContext(ctx, "stripe customer linked", "user_id", userID, "stripe_customer_id", id)
		}
		if cust.Email != email || cust.Name != name {
			// Stripe first: if the local update then fails, the next PUT sees the difference
			// again and repeats the (idempotent) update.
			params := &stripe.CustomerParams{Email: stripe.String(email), Name: stripe.String(name)}
			params.Context = ctx
			if _, err := h.stripe.Customers.Update(cust.StripeID(), params); err != nil {
				// Commit a link made above all the same: it is the expensive part to redo.
				updateErr = stripeclient.APIError(err, "update the customer")
				return nil
			}
			if err := tx.Exec(`UPDATE customers SET email = ?, name = ?, updated_at = ? WHERE user_id = ?`,
				email, name, h.now().UTC(), userID).Error; err != nil {
				return database.APIError(err, "update customer")
			}
			cust.Email, cust.Name = email, name
		}
		return nil
	})
	if err != nil {
		// Errors from inside are answers already; a failed BEGIN or COMMIT is not.
		return nil, false, database.APIError(err, "link customer")
	}
	if updateErr != nil {
		return nil, false, updateErr
	}
	return &cust, created, nil
}

// findOrCreate returns the Stripe customer of a link row that has none yet.
func (h *Handlers) findOrCreate(ctx context.Context, cust *Customer) (string, error) {
	if h.now().Sub(cust.CreatedAt) >= keyWindow {
		// Stripe may have forgotten the key of an attempt made more than a day ago, so a create
		// could make a second customer: look for the one such an attempt would have made. Search
		// lags writes by up to a minute, but an attempt made within that minute used the same
		// key, which Stripe still remembers.
		params := &stripe.CustomerSearchParams{SearchParams: stripe.SearchParams{
			Context: ctx,
			Query:   fmt.Sprintf("metadata['user_id']:'%s'", cust.UserID),
		}}
		it := h.stripe.Customers.Search(params)
		for it.Next() {
			if sc := it.Customer(); sc.Metadata["user_id"] == cust.UserID && !sc.Deleted {
				h.log.InfoContext(ctx, "stripe customer found by search", "user_id", cust.UserID, "stripe_customer_id", sc.ID)
				return sc.ID, nil
			}
		}
		if err := it.Err(); err != nil {
			return "", stripeclient.APIError(err, "search for the customer")
		}
	}
	params := &stripe.CustomerParams{
		Email:    stripe.String(cust.Email),
		Metadata: map[string]string{"user_id": cust.UserID},
	}
	if cust.Name != "" {
		params.Name = stripe.String(cust.Name)
	}
	params.Context = ctx
	params.SetIdempotencyKey("customer-" + cust.UserID)
	sc, err := h.stripe.Customers.New(params)
	if err != nil {
		answer := stripeclient.APIError(err, "create the customer")
		if !stripeclient.Retryable(err) {
			return "", createRefused{answer}
		}
		return "", answer
	}
	return sc.ID, nil
}

// createRefused is Stripe refusing to create the customer (e.g. an address it does not take):
// a final answer that leaves nothing under the idempotency key. answer is the client's answer.
type createRefused struct{ answer error }

func (e createRefused) Error() string { return e.answer.Error() }
func (e createRefused) Unwrap() error { return e.answer }
