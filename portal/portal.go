// Package portal opens Stripe Customer Portal sessions: POST /v1/customers/{user_id}/portal-sessions,
// the cancellation redirect POST /v1/customers/{user_id}/subscriptions/{subscription_id}/cancel and
// the plan change redirect POST …/subscriptions/{subscription_id}/change.
//
// The service never cancels or changes a subscription itself: the redirects send the customer to
// Stripe's own flows, and the outcome comes back as webhook events.
package portal

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
	"gorm.io/gorm"

	"billing/customers"
	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/ids"
	"billing/internal/stripeclient"
)

// SubscriptionLookup reads the local mirror of subscriptions; billing implements it.
type SubscriptionLookup interface {
	// CustomerSubscriptionStatus returns the status of subscriptionID when it belongs to
	// stripeCustomerID in that mode; found=false otherwise.
	CustomerSubscriptionStatus(ctx context.Context, stripeCustomerID string, livemode bool, subscriptionID string) (status string, found bool, err error)
}

// Prices checks the price a change names against the catalog; catalog.Service implements it.
type Prices interface {
	// PriceOf is the price id named by id or lookup key; errors are *apierr.Error values.
	PriceOf(ctx context.Context, priceID, lookupKey *string) (string, error)
}

// Deps are what the portal endpoints need from main.
type Deps struct {
	DB            *gorm.DB
	Stripe        *client.API
	Subscriptions SubscriptionLookup
	// Livemode is the mode of the service (stripe.mode): users linked in the other mode get 409.
	Livemode bool
	// DefaultReturnURL is config portal.return_url: where Stripe sends the customer back.
	DefaultReturnURL string
	// Prices resolves lookup keys and refuses inactive prices; nil passes price_id on as given.
	Prices Prices
	// Now is the proration date of previews; time.Now when nil.
	Now    func() time.Time
	Logger *slog.Logger
}

// Service serves the portal endpoints.
type Service struct {
	db        *gorm.DB
	stripe    *client.API
	subs      SubscriptionLookup
	livemode  bool
	returnURL string
	prices    Prices
	now       func() time.Time
	log       *slog.Logger
}

// New returns the portal service. Logger defaults to a discarding logger.
func New(d Deps) *Service {
	s := &Service{db: d.DB, stripe: d.Stripe, subs: d.Subscriptions, livemode: d.Livemode, returnURL: d.DefaultReturnURL,
		prices: d.Prices, now: d.Now, log: d.Logger}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "portal")
	return s
}

// Mount adds the routes to v1, the /v1 group behind the app backend's authentication.
func (s *Service) Mount(v1 *echo.Group) {
	v1.POST("/customers/:user_id/portal-sessions", s.postSession)
	v1.POST("/customers/:user_id/subscriptions/:subscription_id/cancel", s.postCancel)
	v1.POST("/customers/:user_id/subscriptions/:subscription_id/change", s.postChange)
	v1.POST("/customers/:user_id/subscriptions/:subscription_id/change/preview", s.postPreview)
}

type sessionRequest struct {
	ReturnURL *string `json:"return_url"`
}

type sessionResponse struct {
	URL string `json:"url"`
}

func (s *Service) postSession(c echo.Context) error {
	userID := c.Param("user_id")
	if err := ids.CheckUser(userID); err != nil {
		return err
	}
	var req sessionRequest
	if err := httpserver.DecodeJSON(c, &req, true); err != nil {
		return err
	}
	returnURL := s.returnURL
	if req.ReturnURL != nil {
		if err := checkReturnURL(*req.ReturnURL); err != nil {
			return err
		}
		returnURL = *req.ReturnURL
	}
	ctx := c.Request().Context()
	cust, err := s.customer(ctx, userID)
	if err != nil {
		return err
	}
	params := &stripe.BillingPortalSessionParams{Customer: stripe.String(cust.StripeID())}
	if returnURL != "" {
		params.ReturnURL = stripe.String(returnURL)
	}
	// No idempotency key of ours: a second session is harmless (it expires unused), and a
	// fixed key would hand a repeat an already-used session URL. stripe-go still sends one
	// random key per call, so its own retries of this call do not open two.
	params.Context = ctx
	sess, err := s.stripe.BillingPortalSessions.New(params)
	if err != nil {
		return stripeclient.APIError(err, "open a portal session")
	}
	s.log.InfoContext(ctx, "portal session opened", "user_id", userID, "stripe_customer_id", cust.StripeID())
	return c.JSON(http.StatusCreated, sessionResponse{URL: sess.URL})
}

func (s *Service) postCancel(c echo.Context) error {
	userID, subID := c.Param("user_id"), c.Param("subscription_id")
	if err := ids.CheckUser(userID); err != nil {
		return err
	}
	if err := ids.CheckSubscription(subID); err != nil {
		return err
	}
	ctx := c.Request().Context()
	cust, err := s.liveSubscription(ctx, userID, subID, "is already %s")
	if err != nil {
		return err
	}
	flow := &stripe.BillingPortalSessionFlowDataParams{
		Type: stripe.String("subscription_cancel"),
		SubscriptionCancel: &stripe.BillingPortalSessionFlowDataSubscriptionCancelParams{
			Subscription: stripe.String(subID),
		},
	}
	params := &stripe.BillingPortalSessionParams{Customer: stripe.String(cust.StripeID()), FlowData: flow}
	if s.returnURL != "" {
		params.ReturnURL = stripe.String(s.returnURL)
		flow.AfterCompletion = &stripe.BillingPortalSessionFlowDataAfterCompletionParams{
			Type:     stripe.String("redirect"),
			Redirect: &stripe.BillingPortalSessionFlowDataAfterCompletionRedirectParams{ReturnURL: stripe.String(s.returnURL)},
		}
	}
	// Without a configured return URL the portal shows its own confirmation page after the flow
	// (Stripe requires a URL for the redirect).
	params.Context = ctx
	sess, err := s.stripe.BillingPortalSessions.New(params)
	if err != nil {
		return stripeclient.APIError(err, "open the cancellation flow")
	}
	s.log.InfoContext(ctx, "cancellation flow opened", "user_id", userID, "subscription_id", subID)
	return c.Redirect(http.StatusSeeOther, sess.URL)
}

// liveSubscription returns the customer of userID when subID is theirs and not over: 404 when it
// is unknown or someone else's (the same answer for both), 409 when it is canceled or expired,
// with terminal (a format taking the status) ending the message. Cancel and change both start
// here, so they refuse the same subscriptions.
func (s *Service) liveSubscription(ctx context.Context, userID, subID, terminal string) (*customers.Customer, error) {
	cust, err := s.customer(ctx, userID)
	if err != nil {
		return nil, err
	}
	status, found, err := s.subs.CustomerSubscriptionStatus(ctx, cust.StripeID(), cust.Livemode, subID)
	if err != nil {
		return nil, database.APIError(err, "look up subscription")
	}
	if !found {
		return nil, apierr.New(apierr.CodeNotFound, "user %s has no subscription %s", userID, subID).With("subscription_id", subID)
	}
	if status == string(stripe.SubscriptionStatusCanceled) || status == string(stripe.SubscriptionStatusIncompleteExpired) {
		return nil, apierr.New(apierr.CodeAlreadyCanceled, "subscription %s "+terminal, subID, status).
			With("subscription_id", subID).With("status", status)
	}
	return cust, nil
}

func (s *Service) customer(ctx context.Context, userID string) (*customers.Customer, error) {
	cust, err := customers.Get(ctx, s.db, userID, s.livemode)
	if errors.Is(err, customers.ErrNotFound) {
		return nil, apierr.New(apierr.CodeNoCustomer, "user %s has no Stripe customer", userID)
	}
	if err != nil {
		return nil, database.APIError(err, "load customer")
	}
	return cust, nil
}

func checkReturnURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(raw) > 2048 {
		return apierr.New(apierr.CodeInvalidURL, "return_url must be an absolute http or https URL")
	}
	return nil
}
