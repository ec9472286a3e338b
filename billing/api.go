package billing

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/display"
	"billing/internal/ids"
)

// MountAPI adds, on the /v1 group (app-token auth applied by main):
//
//	GET /customers/:user_id/entitlement  → Entitlement
//
// GET /customers/:user_id (the link with its subscriptions) is the customers package's.
func (s *Service) MountAPI(v1 *echo.Group) {
	v1.GET("/customers/:user_id/entitlement", s.getEntitlement)
}

// MountAdmin adds, on the /admin group (admin auth applied by main):
//
//	GET /holds  → {"holds": [HoldView]}
//	GET ""      → the HTML page (holds and dead letters) at /admin
//	GET "/"     → the same page at /admin/
func (s *Service) MountAdmin(admin *echo.Group) {
	admin.GET("/holds", s.getHolds)
	admin.GET("", s.getAdminPage)
	admin.GET("/", s.getAdminPage)
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
	return c.JSON(http.StatusOK, e)
}

// readError answers a failed read: 404 for an unknown user, 503 when the database is down.
func readError(err error, userID string) error {
	if errors.Is(err, ErrNoCustomer) {
		return apierr.New(apierr.CodeNotFound, "no customer for user %q", userID)
	}
	return database.APIError(err, "load customer "+userID)
}

func (s *Service) getHolds(c echo.Context) error {
	holds, err := s.Holds(c.Request().Context())
	if err != nil {
		return database.APIError(err, "list holds")
	}
	return c.JSON(http.StatusOK, map[string]any{"holds": holds})
}

// adminPageDeadLetters caps the dead letters the page lists.
const adminPageDeadLetters = 100

type adminPageView struct {
	GeneratedAt          string
	Holds                []adminHoldRow
	DeadLettersAvailable bool
	DeadLettersError     string
	DeadLetters          []adminDeadLetterRow
}

type adminHoldRow struct {
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

type adminDeadLetterRow struct {
	EventID   string
	Type      string
	Livemode  bool
	Attempts  int
	DeadAt    string
	LastError string
	ReplayURL string
}

func (s *Service) getAdminPage(c echo.Context) error {
	ctx := c.Request().Context()
	view, err := s.adminPage(ctx)
	if err != nil {
		return database.APIError(err, "build admin page")
	}
	var buf bytes.Buffer
	if err := s.pages.admin.ExecuteTemplate(&buf, "admin", view); err != nil {
		return apierr.Internal(err)
	}
	h := c.Response().Header()
	h.Set("Cache-Control", "no-store")
	// Nothing on the page needs scripts; forms may only post back here.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	return c.HTMLBlob(http.StatusOK, buf.Bytes())
}

func (s *Service) adminPage(ctx context.Context) (*adminPageView, error) {
	holds, err := s.Holds(ctx)
	if err != nil {
		return nil, err
	}
	v := &adminPageView{GeneratedAt: s.now().UTC().Format(time.RFC3339)}
	for _, h := range holds {
		row := adminHoldRow{
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
	if s.deadLetters != nil {
		v.DeadLettersAvailable = true
		dls, err := s.deadLetters.DeadLetters(ctx, adminPageDeadLetters)
		if err != nil {
			// The holds are still worth showing; say what is missing instead of failing the page.
			s.log.ErrorContext(ctx, "admin page: load dead letters", "error", err)
			v.DeadLettersError = "Could not load dead-lettered events; see the service log."
		}
		for _, d := range dls {
			dt := d.DeadAt
			v.DeadLetters = append(v.DeadLetters, adminDeadLetterRow{
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
