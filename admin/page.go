package admin

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/auth"
	"billing/internal/database"
	"billing/internal/display"
)

func (c *Console) getHolds(ec echo.Context) error {
	holds, err := c.holds.Holds(ec.Request().Context())
	if err != nil {
		return database.APIError(err, "list holds")
	}
	return ec.JSON(http.StatusOK, map[string]any{"holds": holds})
}

// pageDeadLetters caps the dead letters the page lists.
const pageDeadLetters = 100

type pageView struct {
	GeneratedAt          string
	CSRF                 string
	Holds                []holdRow
	DeadLettersAvailable bool
	DeadLettersError     string
	DeadLetters          []deadLetterRow
}

type holdRow struct {
	UserID           string
	StripeCustomerID string
	SubscriptionID   string
	Livemode         bool
	Status           string
	HoldReason       string
	Since            string
	Attempts         string
	NextRetry        string
	Amount           string
	InvoiceURL       string
}

type deadLetterRow struct {
	EventID   string
	Type      string
	Livemode  bool
	Attempts  int
	DeadAt    string
	LastError string
	ReplayURL string
}

func (c *Console) getPage(ec echo.Context) error {
	view, err := c.pageView(ec.Request().Context())
	if err != nil {
		return database.APIError(err, "build admin page")
	}
	view.CSRF = auth.CSRFToken(ec)
	var buf bytes.Buffer
	if err := c.page.ExecuteTemplate(&buf, "admin", view); err != nil {
		return apierr.Internal(err)
	}
	h := ec.Response().Header()
	h.Set("Cache-Control", "no-store")
	// Nothing on the page needs scripts; forms may only post back here.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	return ec.HTMLBlob(http.StatusOK, buf.Bytes())
}

func (c *Console) pageView(ctx context.Context) (*pageView, error) {
	holds, err := c.holds.Holds(ctx)
	if err != nil {
		return nil, err
	}
	v := &pageView{GeneratedAt: c.now().UTC().Format(time.RFC3339)}
	for _, h := range holds {
		row := holdRow{
			StripeCustomerID: h.StripeCustomerID,
			SubscriptionID:   h.SubscriptionID,
			Livemode:         h.Livemode,
			Status:           h.Status,
			HoldReason:       h.HoldReason,
			Since:            display.Time(h.OnHoldSince),
			NextRetry:        display.Time(h.NextPaymentAttempt),
			InvoiceURL:       display.SafeURL(deref(h.HostedInvoiceURL)),
		}
		if h.UserID != nil {
			row.UserID = *h.UserID
		}
		if h.AttemptCount != nil {
			row.Attempts = strconv.FormatInt(*h.AttemptCount, 10)
		}
		if h.AmountDue != nil {
			row.Amount = display.Amount(h.AmountDue, deref(h.Currency))
		}
		v.Holds = append(v.Holds, row)
	}
	if c.deadLetters != nil {
		v.DeadLettersAvailable = true
		dls, err := c.deadLetters.DeadLetters(ctx, pageDeadLetters)
		if err != nil {
			// The holds are still worth showing; say what is missing instead of failing the page.
			c.log.ErrorContext(ctx, "admin page: load dead letters", "error", err)
			v.DeadLettersError = "Could not load dead-lettered events; see the service log."
		}
		for _, d := range dls {
			dt := d.DeadAt
			v.DeadLetters = append(v.DeadLetters, deadLetterRow{
				EventID:   d.EventID,
				Type:      d.Type,
				Livemode:  d.Livemode,
				Attempts:  d.Attempts,
				DeadAt:    display.Time(&dt),
				LastError: d.LastError,
				ReplayURL: "/admin/events/" + url.PathEscape(d.EventID) + "/replay",
			})
		}
	}
	return v, nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
