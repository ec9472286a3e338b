package portal

import (
	"context"
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"

	"billing/customers"
	"billing/internal/apierr"
	"billing/internal/httpserver"
	"billing/internal/ids"
	"billing/internal/stripeclient"
)

// maxQuantity is the most seats a change may ask for: above it is a typo, not a plan.
const maxQuantity = 10_000

// changeRequest is the body of change and of its preview.
type changeRequest struct {
	PriceID        *string `json:"price_id"`
	PriceLookupKey *string `json:"price_lookup_key"`
	Quantity       *int64  `json:"quantity"`
}

// change is a validated change of a user's live subscription: the price resolved by the catalog
// (nil: keep it), the quantity (nil: keep it).
type change struct {
	userID, subID string
	cust          *customers.Customer
	price         *string
	quantity      *int64
}

// parseChange validates the path and body of change and preview, as one: the same refusals,
// before anything is sent to Stripe.
func (s *Service) parseChange(c echo.Context) (*change, error) {
	userID, subID := c.Param("user_id"), c.Param("subscription_id")
	if err := ids.CheckUser(userID); err != nil {
		return nil, err
	}
	if err := ids.CheckSubscription(subID); err != nil {
		return nil, err
	}
	var req changeRequest
	if err := httpserver.DecodeJSON(c, &req, true); err != nil {
		return nil, err
	}
	if req.PriceID != nil && req.PriceLookupKey != nil {
		return nil, apierr.New(apierr.CodeInvalidRequest, "give price_id or price_lookup_key, not both")
	}
	if req.PriceID != nil {
		if err := ids.Check(*req.PriceID, "price_id", apierr.CodeInvalidPriceID); err != nil {
			return nil, err
		}
	}
	if req.Quantity != nil && (*req.Quantity < 1 || *req.Quantity > maxQuantity) {
		return nil, apierr.New(apierr.CodeInvalidQuantity, "quantity must be an integer from 1 to %d", maxQuantity)
	}
	ctx := c.Request().Context()
	ch := &change{userID: userID, subID: subID, quantity: req.Quantity}
	if req.PriceID != nil || req.PriceLookupKey != nil {
		if s.prices == nil {
			ch.price = req.PriceID
			if req.PriceLookupKey != nil {
				return nil, apierr.New(apierr.CodeUnknownPrice, "price lookup keys need the catalog, which this service was built without")
			}
		} else {
			id, err := s.prices.PriceOf(ctx, req.PriceID, req.PriceLookupKey)
			if err != nil {
				return nil, err
			}
			ch.price = &id
		}
	}
	cust, err := s.liveSubscription(ctx, userID, subID, "is %s and cannot change")
	if err != nil {
		return nil, err
	}
	ch.cust = cust
	return ch, nil
}

// postChange redirects to the portal's plan change, as postCancel does to its cancellation: the
// service never changes a subscription itself. With a price (or a quantity) the portal opens on
// the confirmation of that change (subscription_update_confirm, which names the subscription
// item, read from Stripe); without, on the choice of a plan (subscription_update). A quantity
// without a price keeps the item's price, a price without a quantity its seats; the new seats
// reach the entitlement by the customer.subscription.updated that Stripe sends once confirmed.
func (s *Service) postChange(c echo.Context) error {
	ch, err := s.parseChange(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	userID, subID, cust := ch.userID, ch.subID, ch.cust

	flow := &stripe.BillingPortalSessionFlowDataParams{}
	if ch.price == nil && ch.quantity == nil {
		flow.Type = stripe.String("subscription_update")
		flow.SubscriptionUpdate = &stripe.BillingPortalSessionFlowDataSubscriptionUpdateParams{Subscription: stripe.String(subID)}
	} else {
		item, err := s.subscriptionItem(ctx, cust, subID)
		if err != nil {
			return err
		}
		price, quantity := ch.price, ch.quantity
		if price == nil {
			// A new quantity of the current plan.
			price = stripe.String(item.Price.ID)
		}
		if quantity == nil {
			// A new plan for the seats bought.
			quantity = stripe.Int64(max(item.Quantity, 1))
		}
		flow.Type = stripe.String("subscription_update_confirm")
		flow.SubscriptionUpdateConfirm = &stripe.BillingPortalSessionFlowDataSubscriptionUpdateConfirmParams{
			Subscription: stripe.String(subID),
			Items: []*stripe.BillingPortalSessionFlowDataSubscriptionUpdateConfirmItemParams{
				{ID: stripe.String(item.ID), Price: price, Quantity: quantity},
			},
		}
	}
	params := &stripe.BillingPortalSessionParams{Customer: stripe.String(cust.StripeID()), FlowData: flow}
	if s.returnURL != "" {
		params.ReturnURL = stripe.String(s.returnURL)
		flow.AfterCompletion = &stripe.BillingPortalSessionFlowDataAfterCompletionParams{
			Type:     stripe.String("redirect"),
			Redirect: &stripe.BillingPortalSessionFlowDataAfterCompletionRedirectParams{ReturnURL: stripe.String(s.returnURL)},
		}
	}
	params.Context = ctx
	sess, err := s.stripe.BillingPortalSessions.New(params)
	if err != nil {
		return stripeclient.APIError(err, "open the plan change flow")
	}
	s.log.InfoContext(ctx, "plan change flow opened", "user_id", userID, "subscription_id", subID, "flow", *flow.Type)
	return c.Redirect(http.StatusSeeOther, sess.URL)
}

// subscriptionItem reads the subscription from Stripe for the id of its one item, which the
// confirmation flow must name. The local mirror keeps no item ids; a read is one call per change.
func (s *Service) subscriptionItem(ctx context.Context, cust *customers.Customer, subID string) (*stripe.SubscriptionItem, error) {
	params := &stripe.SubscriptionParams{}
	params.Context = ctx
	sub, err := s.stripe.Subscriptions.Get(subID, params)
	var se *stripe.Error
	if errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound {
		return nil, apierr.New(apierr.CodeNotFound, "Stripe knows no subscription %s", subID).With("subscription_id", subID)
	}
	if err != nil {
		return nil, stripeclient.APIError(err, "read the subscription")
	}
	if sub.Customer == nil || sub.Customer.ID != cust.StripeID() {
		// The mirror and Stripe disagree about whose it is: no flow for someone else's.
		return nil, apierr.New(apierr.CodeNotFound, "user %s has no subscription %s", cust.UserID, subID).With("subscription_id", subID)
	}
	if sub.Items == nil || len(sub.Items.Data) != 1 || sub.Items.Data[0].Price == nil {
		n := 0
		if sub.Items != nil {
			n = len(sub.Items.Data)
		}
		return nil, apierr.New(apierr.CodeConflict,
			"subscription %s has %d items; change it without price_id and quantity to choose in the portal", subID, n).
			With("subscription_id", subID)
	}
	return sub.Items.Data[0], nil
}
