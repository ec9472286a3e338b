package httpserver

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// knownMethods are the methods that get their own metric label; any other is "other", so that
// a client sending made-up methods cannot grow the label set (and the process) without bound.
var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

func methodLabel(m string) string {
	if knownMethods[m] {
		return m
	}
	return "other"
}

// routeLabel is the pattern of the route echo matched (a finite set: the registered routes and
// the groups' catch-alls), never the request's path.
func routeLabel(c echo.Context) string {
	if r := c.Path(); r != "" {
		return r
	}
	return "unmatched"
}

// flushMargin: an answer finished this close to the write deadline is flushed by the middleware
// so that whether it went out is known before the request is logged.
const flushMargin = time.Second

// requestLog observes every request and logs it once, at requestLevel, with the status that was
// answered and whether the answer could be written: an answer lost to a write error or to the
// write deadline is logged as an error with written=false, never as a success.
func requestLog(logger *slog.Logger, duration *prometheus.HistogramVec, writeTimeout time.Duration, now func() time.Time) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := now()
			deadline := start.Add(writeTimeout)
			res := c.Response()
			w := &recordingWriter{ResponseWriter: res.Writer}
			res.Writer = w
			// The server's own deadline started when the header was read, a moment earlier; move it
			// to the one checked below so that both agree (now is time.Now outside tests). Writers
			// without deadlines (tests) say ErrNotSupported, which is fine.
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))

			if err := next(c); err != nil {
				// Let the error handler write the answer now so that the status we log is the real one.
				c.Error(err)
			}
			end := now()
			if w.err == nil && res.Committed && !end.Before(deadline.Add(-flushMargin)) {
				_ = http.NewResponseController(w).Flush()
			}
			var writeErr error
			switch {
			case w.err != nil:
				writeErr = w.err
			case !end.Before(deadline):
				writeErr = errWriteDeadline
			}

			status := res.Status
			elapsed := end.Sub(start)
			route := routeLabel(c)
			duration.WithLabelValues(route, methodLabel(c.Request().Method), strconv.Itoa(status)).Observe(elapsed.Seconds())
			level := requestLevel(c.Request().Method, route, status, elapsed, writeErr)
			ctx := c.Request().Context()
			if !logger.Enabled(ctx, level) {
				return nil
			}
			attrs := []slog.Attr{
				slog.String("method", c.Request().Method),
				slog.String("path", c.Request().URL.Path),
				slog.String("route", route),
				slog.Int("status", status),
				slog.Duration("duration", elapsed),
				slog.String("request_id", res.Header().Get(echo.HeaderXRequestID)),
				slog.Bool("written", writeErr == nil),
			}
			if writeErr != nil {
				// status is the answer the handler meant to give; the client did not get it.
				attrs = append(attrs, slog.String("error", writeErr.Error()))
			}
			logger.LogAttrs(ctx, level, "http request", attrs...)
			return nil
		}
	}
}

// SlowRead is how long a read may take before its request is logged at info.
const SlowRead = time.Second

// requestLevel is the level of a request's log line. An answer that was not written is an
// error. A read answered successfully and quickly is a debug line, like the probes: the app may
// poll its entitlement on every page, so such lines would be most of the log, and most of the
// cost of serving the read, while saying nothing the request metrics don't. Every write, every
// refused or failed request and every slow read is an info line.
func requestLevel(method, route string, status int, elapsed time.Duration, writeErr error) slog.Level {
	switch {
	case writeErr != nil:
		return slog.LevelError
	case route == "/healthz" || route == "/readyz" || route == "/metrics":
		return slog.LevelDebug
	case (method == http.MethodGet || method == http.MethodHead) && status < 400 && elapsed < SlowRead:
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

var errWriteDeadline = errors.New("answer finished after the write deadline")

// recordingWriter remembers the first error of a write or a flush to the client.
type recordingWriter struct {
	http.ResponseWriter
	err error
}

func (w *recordingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

// FlushError is what http.ResponseController (and so echo's Flush) calls.
func (w *recordingWriter) FlushError() error {
	err := http.NewResponseController(w.ResponseWriter).Flush()
	if err != nil && !errors.Is(err, http.ErrNotSupported) && w.err == nil {
		w.err = err
	}
	return err
}

// Unwrap lets http.ResponseController reach the connection (deadlines, hijacking).
func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
