package customers

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
	"gorm.io/gorm"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/ids"
	"billing/internal/outbound"
	"billing/internal/stripeclient"
)

// Accounts tells the app of a user's entitlement after a link changed it (billing.Service
// implements it). The customers package is below billing: it owns the link, billing reads it.
type Accounts interface {
	// TellUser tells the app, in tx, of the user's entitlement after a link changed it.
	TellUser(ctx context.Context, tx *gorm.DB, userID string) error
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
}

type putRequest struct {
	Email string `json:"email"`
	Name  string `json:"name"`
	// StripeCustomerID links an existing Stripe customer instead of making one (link.go).
	StripeCustomerID string `json:"stripe_customer_id"`
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
	if req.StripeCustomerID != "" {
		return h.putExisting(c, userID, req)
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

// CustomerKey is the Stripe idempotency key of a user's customer.
func CustomerKey(userID string) string { return outbound.Key("customer", userID) }

// Ensure links userID to a Stripe customer, creating it on first use, and brings email and name
// up to date locally and on Stripe. created reports whether this call made the link. Errors are
// *apierr.Error values.
//
// The link is made by the outbound protocol: the row is inserted (committed) before Stripe is
// called, and the Stripe customer is created with the first request's email and name under the
// key customer-{user_id}, so that a retry after a crash sends the very same parameters with the
// same key and Stripe answers with the customer it already made. A create that Stripe refuses
// outright leaves nothing under the key, so the unfinished row is dropped and the next PUT starts
// over with its own values. An update of email or name follows in a transaction of its own, so
// that the link, the expensive part to redo, is committed whatever becomes of the update.
func (h *Handlers) Ensure(ctx context.Context, userID, email, name string) (*Customer, bool, error) {
	now := h.now().UTC()
	err := h.db.WithContext(ctx).Exec(`
		INSERT INTO customers (user_id, email, name, livemode, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $5)
		ON CONFLICT (user_id, livemode) DO NOTHING`,
		userID, email, name, h.livemode, now).Error
	if err != nil {
		return nil, false, database.APIError(err, "insert customer link")
	}
	cust, created, err := h.link(ctx, userID)
	if err != nil {
		return nil, false, err
	}
	if cust.Email != email || cust.Name != name {
		if err := h.update(ctx, cust, email, name); err != nil {
			return nil, false, err
		}
	}
	return cust, created, nil
}

// link finishes the user's link row if it has no Stripe customer yet.
func (h *Handlers) link(ctx context.Context, userID string) (*Customer, bool, error) {
	var cust Customer
	res, err := outbound.Run(ctx, h.db, outbound.Call[*stripe.Customer]{
		Lock: outbound.Select{SQL: `SELECT * FROM customers WHERE user_id = $1 AND livemode = $2`, Args: []any{userID, h.livemode}, Into: &cust},
		Locked: func(*gorm.DB) (outbound.State, error) {
			return outbound.State{Key: CustomerKey(userID), CreatedAt: cust.CreatedAt, Done: cust.StripeCustomerID != nil}, nil
		},
		Find: func(ctx context.Context) (*stripe.Customer, bool, error) { return h.findCustomer(ctx, userID) },
		Create: func(p stripe.Params) (*stripe.Customer, error) {
			// The row's values, not the request's: every attempt under the key sends the same.
			params := &stripe.CustomerParams{
				Params:   p,
				Email:    stripe.String(cust.Email),
				Metadata: map[string]string{"user_id": cust.UserID},
			}
			if cust.Name != "" {
				params.Name = stripe.String(cust.Name)
			}
			return h.stripe.Customers.New(params)
		},
		Complete: func(tx *gorm.DB, sc *stripe.Customer, a outbound.Attempt) error {
			if err := tx.Exec(`UPDATE customers SET stripe_customer_id = $1, updated_at = $2 WHERE user_id = $3 AND livemode = $4`,
				sc.ID, a.At, userID, h.livemode).Error; err != nil {
				return fmt.Errorf("store Stripe customer id: %w", err)
			}
			cust.StripeCustomerID = &sc.ID
			h.log.InfoContext(ctx, "stripe customer linked", "user_id", userID, "stripe_customer_id", sc.ID)
			// A new customer has nothing yet, unless its events came before this commit.
			return h.accounts.TellUser(ctx, tx, userID)
		},
		Refuse: func(tx *gorm.DB, _ outbound.Attempt) error {
			// Nothing exists under the key, so the unfinished link is dropped and the next PUT
			// starts over with its own values. Kept, it would make every later PUT resend the
			// refused ones, forever.
			if err := tx.Exec(`DELETE FROM customers WHERE user_id = $1 AND livemode = $2 AND stripe_customer_id IS NULL`,
				userID, h.livemode).Error; err != nil {
				return fmt.Errorf("drop refused customer link: %w", err)
			}
			return nil
		},
		RecordAttempt: func(tx *gorm.DB, a outbound.Attempt) error {
			// The table has no attempt columns; updated_at at least dates the last attempt.
			if err := tx.Exec(`UPDATE customers SET updated_at = $1 WHERE user_id = $2 AND livemode = $3`, a.At, userID, h.livemode).Error; err != nil {
				return fmt.Errorf("record customer attempt: %w", err)
			}
			return nil
		},
		Now: h.now,
		Log: h.log.With("user_id", userID),
	})
	if err != nil {
		return nil, false, database.APIError(err, "link customer")
	}
	switch res.Outcome {
	case outbound.Gone:
		// Dropped by a concurrent request whose create Stripe refused, while we waited.
		return nil, false, linkChanged(userID)
	case outbound.Refused, outbound.Pending:
		what := "create the customer"
		if res.Attempt.Step == outbound.StepFind {
			what = "search for the customer"
		}
		return nil, false, stripeclient.APIError(res.Attempt.Err, what)
	}
	return &cust, res.Outcome == outbound.Completed, nil
}

// findCustomer looks for the customer an earlier attempt at the user's link made.
func (h *Handlers) findCustomer(ctx context.Context, userID string) (*stripe.Customer, bool, error) {
	params := &stripe.CustomerSearchParams{SearchParams: stripe.SearchParams{
		Context: ctx,
		// User ids are [A-Za-z0-9_-]: nothing to escape in the query.
		Query: fmt.Sprintf("metadata['user_id']:'%s'", userID),
	}}
	it := h.stripe.Customers.Search(params)
	for it.Next() {
		if sc := it.Customer(); sc.Metadata["user_id"] == userID && !sc.Deleted {
			return sc, true, nil
		}
	}
	if err := it.Err(); err != nil {
		return nil, false, fmt.Errorf("search customer of user %q: %w", userID, err)
	}
	return nil, false, nil
}

// update brings a linked customer's email and name to the given values, under the row lock so
// that concurrent PUTs leave Stripe and the row agreeing. Stripe first: if the local update then
// fails, the next PUT sees the difference again and repeats the (idempotent) update.
func (h *Handlers) update(ctx context.Context, cust *Customer, email, name string) error {
	err := h.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Raw(`SELECT * FROM customers WHERE user_id = $1 AND livemode = $2 FOR UPDATE`, cust.UserID, h.livemode).Scan(cust)
		if res.Error != nil {
			return database.APIError(res.Error, "lock customer link")
		}
		if res.RowsAffected == 0 || cust.StripeCustomerID == nil {
			return linkChanged(cust.UserID)
		}
		if cust.Email == email && cust.Name == name {
			return nil
		}
		params := &stripe.CustomerParams{Email: stripe.String(email), Name: stripe.String(name)}
		params.Context = ctx
		if _, err := h.stripe.Customers.Update(cust.StripeID(), params); err != nil {
			return stripeclient.APIError(err, "update the customer")
		}
		// The new values are the newest word: a customer.updated from before this PUT, delivered
		// late, must not bring the old ones back (customers/events.go). Events of the PUT's own
		// second still apply (Stripe's clock has whole seconds; a tie goes to Stripe).
		if err := tx.Exec(`UPDATE customers SET email = $1, name = $2, updated_at = $3,
			cus_event_created = GREATEST(cus_event_created, date_trunc('second', CAST($3 AS timestamptz))),
			cus_event_rank = coalesce(cus_event_rank, 0), cus_event_id = coalesce(cus_event_id, '')
			WHERE user_id = $4 AND livemode = $5`,
			email, name, h.now().UTC(), cust.UserID, h.livemode).Error; err != nil {
			return database.APIError(err, "update customer")
		}
		cust.Email, cust.Name = email, name
		return nil
	})
	// Errors from inside are answers already; a failed BEGIN or COMMIT is not.
	return database.APIError(err, "update customer link")
}

func linkChanged(userID string) error {
	return apierr.New(apierr.CodeConflict, "the customer link of user %s changed meanwhile; repeat the request", userID)
}
