package entitlements

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
)

// FeatureAnswer is GET /v1/customers/{user_id}/features/{lookup_key}: whether the user may use a
// feature now, and why in words. The app asks it on every gated request, so it costs what the
// entitlement read costs: one indexed statement, which answers whether the customer's list holds
// the feature instead of the list.
type FeatureAnswer struct {
	UserID  string `json:"user_id"`
	Feature string `json:"feature"`
	Allowed bool   `json:"allowed"`
	Reason  string `json:"reason"`
}

// Feature answers whether a user may use the feature lookupKey now, or ErrNoCustomer for an
// unknown user. Local state only.
func (s *Service) Feature(ctx context.Context, userID, lookupKey string) (*FeatureAnswer, error) {
	rd, err := s.readEntitlement(ctx, featureQuery, userID, lookupKey)
	if err != nil {
		return nil, err
	}
	now := s.now()
	best := s.policy.Best(rd.subs, now)
	return &FeatureAnswer{
		UserID:  userID,
		Feature: lookupKey,
		Allowed: s.policy.FeatureAllowed(best, rd.hasFeature, now),
		Reason:  s.policy.FeatureReason(best, lookupKey, rd.hasFeature, now),
	}, nil
}

// lookupKeyParam is the feature of the path, decoded, refused when no feature can have it.
func lookupKeyParam(c echo.Context) (string, error) {
	key := c.Param("lookup_key")
	if c.Request().URL.RawPath != "" {
		// The router matched the escaped path: the parameter is still escaped.
		if k, err := url.PathUnescape(key); err == nil {
			key = k
		}
	}
	if key == "" || len(key) > maxLookupKey || !utf8.ValidString(key) {
		return "", apierr.New(apierr.CodeInvalidLookupKey, "a feature's lookup key is 1 to %d characters of UTF-8", maxLookupKey)
	}
	for _, r := range key {
		if r < 0x20 || r == 0x7f {
			return "", apierr.New(apierr.CodeInvalidLookupKey, "a feature's lookup key has no control characters")
		}
	}
	return key, nil
}

func (s *Service) getFeature(c echo.Context) error {
	userID, err := userIDParam(c)
	if err != nil {
		return err
	}
	key, err := lookupKeyParam(c)
	if err != nil {
		return err
	}
	a, err := s.Feature(c.Request().Context(), userID, key)
	if err != nil {
		return readError(err, userID)
	}
	if c.Request().URL.RawQuery != "" || c.Echo().Debug {
		return c.JSON(http.StatusOK, a)
	}
	bp := entitlementBufs.Get().(*[]byte)
	defer entitlementBufs.Put(bp)
	b := appendFeatureJSON((*bp)[:0], a)
	*bp = b[:0]
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, b)
}

// appendFeatureJSON appends a as encoding/json encodes it, with the encoder's newline: the
// feature answer is as hot as the entitlement (see writeEntitlement).
func appendFeatureJSON(b []byte, a *FeatureAnswer) []byte {
	b = append(b, `{"user_id":`...)
	b = appendJSONString(b, a.UserID)
	b = append(b, `,"feature":`...)
	b = appendJSONString(b, a.Feature)
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, a.Allowed)
	b = append(b, `,"reason":`...)
	b = appendJSONString(b, a.Reason)
	return append(b, "}\n"...)
}
