// Package httpserver builds the service's echo instance: the JSON error handler, request ids,
// request logs, HTTP metrics, panics turned into 500s, and the health and metrics endpoints.
// Domain packages only add their routes.
package httpserver

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"billing/internal/apierr"
)

// ReadyFunc reports why the service cannot serve yet (nil when ready).
type ReadyFunc func(ctx context.Context) error

// Options are the pieces the server needs from main.
type Options struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	Ready    ReadyFunc
	// WriteTimeout is the server's; an answer finished after it is logged as not written.
	// Zero means WriteTimeout.
	WriteTimeout time.Duration
	// Now is the request log's clock, for tests; nil means time.Now.
	Now func() time.Time
}

// New returns an echo instance with the service's middleware and /healthz, /readyz, /metrics.
func New(opts Options) *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = ErrorHandler(opts.Logger)

	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "billing_http_request_duration_seconds",
		Help:    "HTTP request duration by route (the matched route's pattern, or unmatched), method (the standard ones, or other) and status.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"route", "method", "status"})
	opts.Registry.MustRegister(duration)

	writeTimeout := opts.WriteTimeout
	if writeTimeout <= 0 {
		writeTimeout = WriteTimeout
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	e.Use(requestID())
	e.Use(securityHeaders)
	// The request log is outside the recoverer so that a panic's 500 is logged like any answer.
	e.Use(requestLog(opts.Logger, duration, writeTimeout, now))
	e.Use(recoverer(opts.Logger))

	e.GET("/healthz", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
	})
	e.GET("/readyz", func(c echo.Context) error {
		ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
		defer cancel()
		if err := opts.Ready(ctx); err != nil {
			opts.Logger.Warn("not ready", "error", err)
			return apierr.Wrap(err, apierr.CodeUnavailable, "not ready: %s", readyReason(err))
		}
		return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
	})
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{})))
	return e
}

// securityHeaders: no answer of this API is meant for a cache (they are per caller, and the
// admin ones carry event payloads), and none may be content-sniffed into something else.
// Handlers may still override either header.
// The values are shared by every answer instead of allocated for each: a handler that changes a
// header replaces its slice (Set) or appends past its capacity (Add), never writes into it.
func securityHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h["X-Content-Type-Options"] = nosniff
		h["Cache-Control"] = noStore
		return next(c)
	}
}

var (
	nosniff = []string{"nosniff"}
	noStore = []string{"no-store"}
)

// ErrNotReady marks a readiness failure whose message may be shown to the caller
// (it says which dependency, never a connection string).
type ErrNotReady struct{ Reason string }

func (e ErrNotReady) Error() string { return e.Reason }

func readyReason(err error) string {
	var nr ErrNotReady
	if errors.As(err, &nr) {
		return nr.Reason
	}
	return "dependency check failed"
}

func recoverer(logger *slog.Logger) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			defer func() {
				if r := recover(); r != nil {
					if r == http.ErrAbortHandler {
						panic(r)
					}
					logger.Error("panic in handler", "panic", r, "path", c.Request().URL.Path)
					err = apierr.New(apierr.CodeInternal, "internal error")
				}
			}()
			return next(c)
		}
	}
}

// ErrorHandler writes every error as {"error": {"code", "message"}}; causes of 5xx are logged
// once here, with the request id, and never sent to the client.
func ErrorHandler(logger *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		apiErr := toAPIError(err)
		status := apiErr.Status()
		if status >= 500 {
			logger.Error("request failed",
				"code", apiErr.Code,
				"error", err,
				"method", c.Request().Method,
				"path", c.Request().URL.Path,
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID),
			)
		}
		if c.Request().Method == http.MethodHead {
			err = c.NoContent(status)
		} else {
			err = c.JSON(status, apiErr.Body())
		}
		if err != nil {
			logger.Error("write error response", "error", err)
		}
	}
}

func toAPIError(err error) *apierr.Error {
	if e, ok := apierr.As(err); ok {
		return e
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			return apierr.New(apierr.CodeRouteNotFound, "no such route")
		case http.StatusMethodNotAllowed:
			return apierr.New(apierr.CodeMethodNotAllowed, "method not allowed on this route")
		case http.StatusRequestEntityTooLarge:
			return apierr.New(apierr.CodeBodyTooLarge, "request body too large")
		case http.StatusUnsupportedMediaType:
			return apierr.New(apierr.CodeUnsupportedMedia, "unsupported content type")
		case http.StatusUnauthorized:
			return apierr.New(apierr.CodeUnauthorized, "missing or invalid credentials")
		case http.StatusBadRequest:
			return apierr.Wrap(err, apierr.CodeInvalidRequest, "bad request")
		}
		if he.Code < 500 {
			return apierr.Wrap(err, apierr.CodeInvalidRequest, "%s", http.StatusText(he.Code))
		}
	}
	return apierr.Internal(err)
}
