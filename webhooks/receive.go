package webhooks

import (
	"errors"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
)

// MaxBodyBytes caps a delivery. Stripe's events are a few KB; 1 MiB leaves room for large
// invoices without letting a client make us buffer without bound.
const MaxBodyBytes = 1 << 20

// Delivery results, answered as {"status": …}.
const (
	ResultReceived  = "received"
	ResultDuplicate = "duplicate"
	ResultIgnored   = "ignored"
)

// MountWebhook registers POST /webhooks/stripe.
func (i *Inbox) MountWebhook(e *echo.Echo) {
	e.POST("/webhooks/stripe", i.receive)
}

// receive verifies, stores and acknowledges one delivery. Its durable effects commit together
// before the 200: the event row and either its applied effects or its processing job.
func (i *Inbox) receive(c echo.Context) error {
	// The header first: a request that cannot be signed costs no read of its body.
	header := c.Request().Header.Get("Stripe-Signature")
	if header == "" {
		return i.reject(apierr.CodeMissingSignature, nil, "the Stripe-Signature header is missing")
	}
	if _, err := parseSignatureHeader(header); err != nil {
		return i.reject(apierr.CodeMalformedSignature, err, "the Stripe-Signature header is malformed: expected t=<timestamp>,v1=<hex signature>")
	}
	// The raw body, read whole before anything can parse it (the signature covers these exact
	// bytes), under the byte budget shared by every delivery not yet verified.
	body, release, err := i.bodies.ReadBody(c.Request(), MaxBodyBytes)
	defer release()
	switch {
	case errors.Is(err, httpserver.ErrBodyTooLarge):
		return i.reject(apierr.CodeBodyTooLarge, nil, "body exceeds %d bytes", MaxBodyBytes)
	case errors.Is(err, httpserver.ErrBudgetSpent):
		c.Response().Header().Set("Retry-After", "1")
		return i.reject(apierr.CodeBusy, nil, "too many deliveries are being received right now; retry later")
	case err != nil:
		return i.reject(apierr.CodeInvalidRequest, err, "could not read the request body")
	}
	// Verify before reading anything of the body, with the secrets of both modes: an unsigned
	// caller learns neither how a parser reads its body nor which modes have secrets.
	modes, err := VerifySignatureModes(body, header, i.secrets(false), i.secrets(true), i.cfg.Tolerance, i.cfg.Now())
	switch {
	case errors.Is(err, ErrStaleTimestamp):
		return i.reject(apierr.CodeStaleTimestamp, err, "the signature timestamp is more than %s from the current time", i.cfg.Tolerance)
	case errors.Is(err, ErrBadSignature):
		return i.reject(apierr.CodeInvalidSignature, err, "no signature matches a configured webhook secret")
	case err != nil:
		return i.reject(apierr.CodeMalformedSignature, err, "the Stripe-Signature header is malformed")
	}
	env, code, err := readEvent(body)
	if err != nil {
		return i.reject(code, err, "%s", err.Error())
	}
	// The mode is the signer's: a secret of one mode never gets an event of the other stored.
	if !modes.Has(*env.Livemode) {
		return i.reject(apierr.CodeLivemodeMismatch, nil, "the event has livemode %t but is signed with a %s-mode webhook secret",
			*env.Livemode, mode(!*env.Livemode))
	}

	result, err := i.store(c.Request().Context(), env, body)
	if errors.Is(err, errEventIDConflict) {
		return i.reject(apierr.CodeEventIDConflict, err, "%s", err.Error())
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
			// A data exception: jsonb refuses some JSON that Go accepts (\u0000, invalid UTF-8,
			// numbers out of range). No retry could ever store it, so it must not be a 5xx.
			return i.reject(apierr.CodeNotAnEvent, err, "the event cannot be stored: %s", pgErr.Message)
		}
		if database.IsUnavailable(err) {
			return apierr.Wrap(err, apierr.CodeDatabaseDown, "the event could not be stored; retry later")
		}
		return apierr.Wrap(err, apierr.CodeInternal, "the event could not be stored; retry later")
	}
	i.metrics.received.WithLabelValues(i.typeLabel(env.Type), mode(*env.Livemode), result.metric).Inc()
	return c.JSON(http.StatusOK, map[string]string{"status": result.status, "event_id": env.ID})
}

func (i *Inbox) reject(code apierr.Code, err error, format string, args ...any) error {
	i.metrics.rejected.WithLabelValues(string(code)).Inc()
	return apierr.Wrap(err, code, format, args...)
}

// typeLabel is an event type as a metric label: the handled types by name, every other one as
// "other", so that signed events of made-up types cannot add series without bound.
func (i *Inbox) typeLabel(typ string) string {
	if _, ok := i.cfg.Registry.Lookup(typ); ok {
		return typ
	}
	return "other"
}
