package checkout

import (
	"context"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"

	"billing/internal/apierr"
	"billing/internal/stripeclient"
)

// maxPromotionCode bounds what a customer may type; Stripe's codes are shorter.
const maxPromotionCode = 200

// checkPromotionCode refuses what no promotion code can be: Stripe's codes are letters, digits,
// dashes and underscores.
func checkPromotionCode(code string) error {
	if code == "" || len(code) > maxPromotionCode {
		return apierr.New(apierr.CodeInvalidPromotionCode, "promotion_code is 1 to %d characters", maxPromotionCode)
	}
	for _, r := range code {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return apierr.New(apierr.CodeInvalidPromotionCode, "promotion_code %q is not a code: letters, digits, - and _ only", code)
		}
	}
	return nil
}

// priceOf is the price the request names, checked against the catalog.
func (s *Service) priceOf(ctx context.Context, req createRequest) (string, error) {
	if s.prices == nil {
		if req.PriceLookupKey != nil {
			return "", apierr.New(apierr.CodeUnknownPrice, "price lookup keys need the catalog, which this service was built without")
		}
		return req.PriceID, nil
	}
	var id *string
	if req.PriceLookupKey == nil {
		id = &req.PriceID
	}
	return s.prices.PriceOf(ctx, id, req.PriceLookupKey)
}

// promotionCode resolves the code a customer typed to Stripe's promotion code (promo_…), and
// refuses, before a session is asked for, what Stripe would refuse at it: no such code, a code
// no longer active, expired, used up, or for another customer. Stripe's codes are
// case-insensitive and unique among active codes; inactive ones may share a code.
func (s *Service) promotionCode(ctx context.Context, code, customerID string) (*string, error) {
	params := &stripe.PromotionCodeListParams{Code: stripe.String(code)}
	params.Context = ctx
	params.Limit = stripe.Int64(10)
	it := s.stripe.PromotionCodes.List(params)
	var refusal *apierr.Error
	for it.Next() {
		pc := it.PromotionCode()
		if !strings.EqualFold(pc.Code, code) {
			continue
		}
		why := s.promotionRefusal(pc, customerID)
		if why == "" {
			return &pc.ID, nil
		}
		if refusal == nil {
			refusal = apierr.New(apierr.CodeInvalidPromotionCode, "promotion code %s %s", code, why).With("promotion_code", code)
		}
	}
	if err := it.Err(); err != nil {
		return nil, stripeclient.APIError(err, "look up the promotion code")
	}
	if refusal != nil {
		return nil, refusal
	}
	return nil, apierr.New(apierr.CodeInvalidPromotionCode, "no promotion code %s exists in this mode", code).With("promotion_code", code)
}

// promotionRefusal says why Stripe would refuse pc for customerID ("" when it would not).
func (s *Service) promotionRefusal(pc *stripe.PromotionCode, customerID string) string {
	now := s.now()
	switch {
	case !pc.Active:
		return "is no longer active"
	case pc.ExpiresAt > 0 && !now.Before(time.Unix(pc.ExpiresAt, 0)):
		return "expired on " + time.Unix(pc.ExpiresAt, 0).UTC().Format(time.DateOnly)
	case pc.MaxRedemptions > 0 && pc.TimesRedeemed >= pc.MaxRedemptions:
		return "has been used as often as it may be"
	case pc.Customer != nil && pc.Customer.ID != "" && pc.Customer.ID != customerID:
		return "is for another customer"
	case pc.Coupon != nil && !pc.Coupon.Valid:
		return "has a coupon that is no longer valid"
	}
	return ""
}
