package httpserver

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
)

// LimitConcurrency lets at most n requests that match (for example the ones that call Stripe)
// run at once. A request over the limit is answered 503 busy with Retry-After before its handler
// runs, so nothing of it is written, and the client's retry of the same request is safe (its
// idempotency key is derived from business identifiers).
//
// Why: such a request holds a pooled database connection and a row lock for the whole Stripe
// call (up to OutboundBudget). Without a bound, a slow Stripe could let them take every
// connection that webhook receipt and entitlement reads need.
func LimitConcurrency(n int, retryAfter time.Duration, match func(echo.Context) bool) echo.MiddlewareFunc {
	slots := make(chan struct{}, n)
	seconds := strconv.Itoa(max(1, int(retryAfter.Round(time.Second)/time.Second)))
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if !match(c) {
				return next(c)
			}
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
				return next(c)
			default:
				c.Response().Header().Set("Retry-After", seconds)
				return apierr.New(apierr.CodeBusy, "too many requests are calling Stripe right now; retry after %s seconds", seconds)
			}
		}
	}
}

// CallsStripe matches the app's requests that call Stripe: every write of the /v1 API but usage
// records (…/usage), which are stored and answered without a call (a reporter sends them) and are
// the app's most frequent write.
func CallsStripe(c echo.Context) bool {
	m := c.Request().Method
	if m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions {
		return false
	}
	return !strings.HasSuffix(c.Path(), "/usage")
}
