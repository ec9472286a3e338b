package entitlements

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/ids"
)

// MountAPI adds, on the /v1 group (app-token auth applied by main):
//
//	GET /customers/:user_id              → CustomerView
//	GET /customers/:user_id/entitlement  → Entitlement
//	GET /customers/:user_id/features/:lookup_key → FeatureAnswer
//
// The user's invoices are billing's (billing.Service.MountAPI); PUT /customers/:user_id (the
// link) is the customers package's.
func (s *Service) MountAPI(v1 *echo.Group) {
	v1.GET("/customers/:user_id", s.getCustomer)
	v1.GET("/customers/:user_id/entitlement", s.getEntitlement)
	v1.GET("/customers/:user_id/features/:lookup_key", s.getFeature)
}

// getCustomer answers the user's link with its subscriptions and entitlement, from local state
// only (the link itself is the customers package's: PUT /v1/customers/{user_id}).
func (s *Service) getCustomer(c echo.Context) error {
	userID, err := userIDParam(c)
	if err != nil {
		return err
	}
	v, err := s.Customer(c.Request().Context(), userID)
	if err != nil {
		return readError(err, userID)
	}
	return c.JSON(http.StatusOK, v)
}

// userIDParam validates the user id like PUT /v1/customers/{user_id} does (400 invalid_user_id).
func userIDParam(c echo.Context) (string, error) {
	id := c.Param("user_id")
	if err := ids.CheckUser(id); err != nil {
		return "", err
	}
	return id, nil
}

func (s *Service) getEntitlement(c echo.Context) error {
	userID, err := userIDParam(c)
	if err != nil {
		return err
	}
	e, err := s.Entitlement(c.Request().Context(), userID)
	if err != nil {
		return readError(err, userID)
	}
	return writeEntitlement(c, e)
}

// entitlementBufs recycles the buffers entitlement answers are encoded into.
var entitlementBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// writeEntitlement answers e as c.JSON would, byte for byte, without encoding/json's reflection:
// the entitlement is the app's hottest read. A request asking for indented output (?pretty, or
// echo's debug mode), or a value the fast encoder does not take, goes through c.JSON.
func writeEntitlement(c echo.Context, e *Entitlement) error {
	if c.Request().URL.RawQuery != "" || c.Echo().Debug {
		return c.JSON(http.StatusOK, e)
	}
	bp := entitlementBufs.Get().(*[]byte)
	defer entitlementBufs.Put(bp)
	b, ok := appendEntitlementJSON((*bp)[:0], e)
	*bp = b[:0]
	if !ok {
		return c.JSON(http.StatusOK, e)
	}
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, b)
}

// appendEntitlementJSON appends e as encoding/json encodes it (field order, null pointers, HTML
// escaping, RFC 3339 times) followed by the encoder's newline. ok is false for what it leaves to
// encoding/json: a time that json.Marshal refuses (a year outside 0-9999, a zone offset of a day or more).
func appendEntitlementJSON(b []byte, e *Entitlement) (_ []byte, ok bool) {
	b = append(b, `{"user_id":`...)
	b = appendJSONString(b, e.UserID)
	b = append(b, `,"entitled":`...)
	b = strconv.AppendBool(b, e.Entitled)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, e.Status)
	b = append(b, `,"on_hold":`...)
	b = strconv.AppendBool(b, e.OnHold)
	b = append(b, `,"hold_reason":`...)
	b = appendJSONStringPtr(b, e.HoldReason)
	b = append(b, `,"subscription_id":`...)
	b = appendJSONStringPtr(b, e.SubscriptionID)
	b = append(b, `,"price_id":`...)
	b = appendJSONStringPtr(b, e.PriceID)
	b = append(b, `,"current_period_end":`...)
	if b, ok = appendJSONTime(b, e.CurrentPeriodEnd); !ok {
		return b, false
	}
	b = append(b, `,"cancel_at_period_end":`...)
	b = strconv.AppendBool(b, e.CancelAtPeriodEnd)
	b = append(b, `,"trial_end":`...)
	if b, ok = appendJSONTime(b, e.TrialEnd); !ok {
		return b, false
	}
	b = append(b, `,"unconfirmed_since":`...)
	if b, ok = appendJSONTime(b, e.UnconfirmedSince); !ok {
		return b, false
	}
	b = append(b, `,"quantity":`...)
	if e.Quantity == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *e.Quantity, 10)
	}
	b = append(b, `,"features":`...)
	if e.Features == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, f := range e.Features {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, f)
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...), true
}

func appendJSONStringPtr(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendJSONString(b, *s)
}

// appendJSONString appends s quoted. Ids and statuses are plain ASCII and are copied as they are;
// anything encoding/json would escape (quotes, backslashes, control characters, <, >, &,
// non-ASCII) is left to it, so the escaping is always its own.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func appendJSONTime(b []byte, t *time.Time) ([]byte, bool) {
	if t == nil {
		return append(b, "null"...), true
	}
	if y := t.Year(); y < 0 || y > 9999 {
		return b, false
	}
	if _, offset := t.Zone(); offset <= -24*3600 || offset >= 24*3600 {
		return b, false
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), true
}

// readError answers a failed read: 404 for an unknown user, 503 when the database is down.
func readError(err error, userID string) error {
	if errors.Is(err, ErrNoCustomer) {
		return apierr.New(apierr.CodeNotFound, "no customer for user %q", userID)
	}
	return database.APIError(err, "load customer "+userID)
}
