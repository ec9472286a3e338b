package catalog

import (
	"context"
	"errors"
	"net/http"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/ids"
)

// Mount serves the catalog on the app's group (/v1).
func (s *Service) Mount(v1 *echo.Group) {
	v1.GET("/prices", s.getPrices)
}

// PricesAnswer is GET /v1/prices.
type PricesAnswer struct {
	Prices []PriceView `json:"prices"`
}

// maxLookupKey is Stripe's limit of a price's lookup key.
const maxLookupKey = 200

func checkLookupKey(k string) error {
	if k == "" || len(k) > maxLookupKey || !utf8.ValidString(k) {
		return apierr.New(apierr.CodeInvalidLookupKey, "a price's lookup key is 1 to %d characters of UTF-8", maxLookupKey)
	}
	for _, r := range k {
		if r < 0x20 || r == 0x7f {
			return apierr.New(apierr.CodeInvalidLookupKey, "a price's lookup key has no control characters")
		}
	}
	return nil
}

func (s *Service) getPrices(c echo.Context) error {
	var f Filter
	q := c.QueryParams()
	if v, ok := q["active"]; ok {
		switch v[0] {
		case "true":
			f.Active = new(bool)
			*f.Active = true
		case "false":
			f.Active = new(bool)
		default:
			return apierr.New(apierr.CodeInvalidActive, "active is true or false")
		}
	}
	if v, ok := q["product_id"]; ok {
		if err := ids.Check(v[0], "product_id", apierr.CodeInvalidRequest); err != nil {
			return err
		}
		f.ProductID = &v[0]
	}
	if v, ok := q["lookup_key"]; ok {
		if err := checkLookupKey(v[0]); err != nil {
			return err
		}
		f.LookupKey = &v[0]
	}
	prices, err := s.Prices(c.Request().Context(), f)
	if err != nil {
		return database.APIError(err, "list the prices")
	}
	return c.JSON(http.StatusOK, PricesAnswer{Prices: prices})
}

// PriceOf is the price id a request names, by price_id or price_lookup_key (one of them, or
// neither when optional), checked against the catalog so that nothing Stripe would refuse is sent:
// an unknown lookup key is 422 unknown_price, an inactive price 422 inactive_price. A price_id the
// catalog does not know passes (the catalog fills from events and reconcile; Stripe decides).
// It answers "" when neither is given.
func (s *Service) PriceOf(ctx context.Context, priceID, lookupKey *string) (string, error) {
	switch {
	case priceID != nil && lookupKey != nil:
		return "", apierr.New(apierr.CodeInvalidRequest, "give price_id or price_lookup_key, not both")
	case lookupKey != nil:
		if err := checkLookupKey(*lookupKey); err != nil {
			return "", err
		}
		p, err := s.Resolve(ctx, *lookupKey)
		switch {
		case errors.Is(err, ErrUnknownPrice):
			return "", apierr.New(apierr.CodeUnknownPrice, "no price has the lookup key %q in this mode", *lookupKey).With("price_lookup_key", *lookupKey)
		case errors.Is(err, ErrInactivePrice):
			return "", apierr.New(apierr.CodeInactivePrice, "the price with lookup key %q (%s) is not sold any more", *lookupKey, p.PriceID).With("price_id", p.PriceID)
		case err != nil:
			return "", database.APIError(err, "resolve the price")
		}
		return p.PriceID, nil
	case priceID != nil:
		if err := ids.Check(*priceID, "price_id", apierr.CodeInvalidPriceID); err != nil {
			return "", err
		}
		p, err := s.Price(ctx, *priceID)
		switch {
		case errors.Is(err, ErrInactivePrice):
			return "", apierr.New(apierr.CodeInactivePrice, "price %s is not sold any more", p.PriceID).With("price_id", p.PriceID)
		case err != nil && !errors.Is(err, ErrUnknownPrice):
			return "", database.APIError(err, "resolve the price")
		}
		return *priceID, nil
	}
	return "", nil
}
