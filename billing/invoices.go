package billing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/ids"
	"billing/webhooks"
)

// Invoice event types beyond payment_failed and payment_succeeded (service.go).
const (
	// EventInvoicePaid: paid, also out of band (marked paid in the dashboard); lifts the hold
	// like payment_succeeded.
	EventInvoicePaid = "invoice.paid"
	// EventInvoicePaymentActionRequired: the customer must authenticate the payment (3-D
	// Secure); a hold with the reason authentication_required and a notice with the invoice's
	// page.
	EventInvoicePaymentActionRequired = "invoice.payment_action_required"
	// EventInvoiceVoided: the invoice is no longer owed; lifts the hold of that invoice (or an
	// older one), as a read of a void latest invoice does (snapshot.go).
	EventInvoiceVoided = "invoice.voided"
	// The rest only keep the invoices table current.
	EventInvoiceFinalized           = "invoice.finalized"
	EventInvoiceUpdated             = "invoice.updated"
	EventInvoiceMarkedUncollectible = "invoice.marked_uncollectible"
)

// invoiceEffect is what an invoice event does to its subscription's payment hold.
type invoiceEffect int

const (
	invoiceRecordOnly invoiceEffect = iota // the invoices table only
	invoiceHolds                           // starts (or keeps) the hold
	invoiceLifts                           // lifts the hold of its invoice or an older one
)

func invoiceEffectOf(eventType string) invoiceEffect {
	switch eventType {
	case EventInvoicePaymentFailed, EventInvoicePaymentActionRequired:
		return invoiceHolds
	case EventInvoicePaymentSucceeded, EventInvoicePaid, EventInvoiceVoided:
		return invoiceLifts
	}
	return invoiceRecordOnly
}

// holdKindOf is the kind of payment hold an event starts (payment_hold_kind).
func holdKindOf(eventType string) string {
	if eventType == EventInvoicePaymentActionRequired {
		return HoldAuthenticationRequired
	}
	return HoldPaymentFailed
}

// invoiceTieRank orders invoice statuses along their lifecycle, for the invoices table's ties
// within one second: the later stage wins, and paid and void are final.
func invoiceTieRank(status string) int {
	switch status {
	case "draft":
		return 1
	case "open":
		return 2
	case "uncollectible":
		return 3
	case "paid", "void":
		return 9
	}
	return 0
}

// keepInvoice writes the invoice of an invoice.* event to the invoices table (keptInvoice's
// statement, alone).
func (s *Service) keepInvoice(ctx context.Context, tx *gorm.DB, ev webhooks.Event, inv *invoiceObject) error {
	query, args := s.keptInvoice(ctx, ev, inv, 1)
	if query == "" {
		return nil
	}
	if _, err := database.Exec(ctx, tx, query, args...); err != nil {
		return fmt.Errorf("apply %s %s to invoice %s: %w", ev.Type, ev.ID, inv.ID, err)
	}
	return nil
}

// keptInvoice is the statement that writes the invoice of an invoice.* event, and its arguments
// numbered from $first (an event that moves a hold runs it inside the subscription's UPDATE: one
// round trip instead of two); "" for an invoice without a customer, which no list could show.
// The row is ordered like the column groups of subscriptions: it takes the event's snapshot
// only when the event's key is newer than the stored one, and a paid or void invoice never goes
// back to another status. Each mode's invoices are rows of their own (keyed with the mode). It
// is one statement: the row of the event's world is created, or ordered against the event (an
// insert, then an update when it existed, cost the second event of every invoice a round trip).
func (s *Service) keptInvoice(ctx context.Context, ev webhooks.Event, inv *invoiceObject, first int) (string, []any) {
	customerID := string(inv.Customer)
	if customerID == "" {
		return "", nil
	}
	created := ev.Created.UTC()
	if inv.Created.Valid {
		created = inv.Created.Time
	}
	status := deref(inv.Status)
	rank := rankOf(ctx, invoiceTieRank(status)*10+invEventRank(ev.Type))
	args := []any{
		inv.ID, ev.Livemode, customerID, nullString(inv.SubscriptionID()), inv.Number, inv.Status, inv.BillingReason, // $1–$7
		inv.AmountDue, inv.AmountPaid, inv.Currency, inv.PeriodStart.Ptr(), inv.PeriodEnd.Ptr(), // $8–$12
		inv.HostedInvoiceURL, inv.InvoicePDF, created, // $13–$15
		ev.ID, ev.Type, ev.Created.UTC(), rank, s.now(), // $16–$20
	}
	return keptInvoiceSQL(first), args
}

// keptInvoiceSQL is keptInvoice's statement with its arguments numbered from $first. The columns
// stay spelled out, the mode among them, for the check that every statement names its mode.
func keptInvoiceSQL(first int) string {
	p := func(k int) string { return "$" + strconv.Itoa(first+k-1) } // the statement's own $k
	return `
		INSERT INTO invoices AS i (invoice_id, livemode, stripe_customer_id, subscription_id, number, status, billing_reason,
		  amount_due, amount_paid, currency, period_start, period_end, hosted_invoice_url, invoice_pdf, created,
		  inv_event_id, inv_event_type, inv_event_created, inv_event_rank, created_at, updated_at)
		VALUES (` + p(1) + `, ` + p(2) + `, ` + p(3) + `, ` + p(4) + `, ` + p(5) + `, ` + p(6) + `, ` + p(7) + `, ` + p(8) + `, ` + p(9) + `, ` + p(10) + `,
		  ` + p(11) + `, ` + p(12) + `, ` + p(13) + `, ` + p(14) + `, ` + p(15) + `, ` + p(16) + `, ` + p(17) + `, ` + p(18) + `, ` + p(19) + `, ` + p(20) + `, ` + p(20) + `)
		ON CONFLICT (invoice_id, livemode) DO UPDATE SET stripe_customer_id = ` + p(3) + `, subscription_id = ` + p(4) + `, number = ` + p(5) + `,
		  status = ` + p(6) + `, billing_reason = ` + p(7) + `, amount_due = ` + p(8) + `, amount_paid = ` + p(9) + `, currency = ` + p(10) + `,
		  period_start = ` + p(11) + `, period_end = ` + p(12) + `, hosted_invoice_url = ` + p(13) + `, invoice_pdf = ` + p(14) + `, created = ` + p(15) + `,
		  inv_event_id = ` + p(16) + `, inv_event_type = ` + p(17) + `, inv_event_created = ` + p(18) + `, inv_event_rank = ` + p(19) + `, updated_at = ` + p(20) + `
		WHERE ` + newerThanStored("i.inv", first+17, first+18, first+15) + `
		  AND (i.status IS NULL OR i.status NOT IN ('paid', 'void') OR CAST(` + p(6) + ` AS text) IN ('paid', 'void'))`
}

// InvoiceView is one entry of GET /v1/customers/{user_id}/invoices, read straight from the
// invoices table (the column tags).
type InvoiceView struct {
	InvoiceID        string     `gorm:"column:invoice_id" json:"invoice_id"`
	Number           *string    `gorm:"column:number" json:"number"`
	Status           *string    `gorm:"column:status" json:"status"`
	AmountDue        *int64     `gorm:"column:amount_due" json:"amount_due"`
	AmountPaid       *int64     `gorm:"column:amount_paid" json:"amount_paid"`
	Currency         *string    `gorm:"column:currency" json:"currency"`
	PeriodStart      *time.Time `gorm:"column:period_start" json:"period_start"`
	PeriodEnd        *time.Time `gorm:"column:period_end" json:"period_end"`
	HostedInvoiceURL *string    `gorm:"column:hosted_invoice_url" json:"hosted_invoice_url"`
	InvoicePDF       *string    `gorm:"column:invoice_pdf" json:"invoice_pdf"`
	Created          time.Time  `gorm:"column:created" json:"created"`
	SubscriptionID   *string    `gorm:"column:subscription_id" json:"subscription_id"`
}

// InvoicePage is GET /v1/customers/{user_id}/invoices.
type InvoicePage struct {
	Invoices []InvoiceView `json:"invoices"`
	HasMore  bool          `json:"has_more"`
}

// Page sizes of the invoice list.
const (
	defaultInvoiceLimit = 10
	maxInvoiceLimit     = 100
)

// ErrUnknownInvoice is a starting_after that is not an invoice of the user's customer.
var ErrUnknownInvoice = errors.New("starting_after is not an invoice of this customer")

// Invoices lists the invoices of a user's customer, newest first (by the invoice's creation, then
// its id), limit at a time after the invoice startingAfter ("" for the first page). Local state
// only, and only invoices of the customer's own mode. Drafts are left out: Stripe may delete
// them, and a customer has nothing to pay or download before finalization. ErrNoCustomer for a
// user without a linked customer.
func (s *Service) Invoices(ctx context.Context, userID string, limit int, startingAfter string) (*InvoicePage, error) {
	var cust []struct {
		StripeCustomerID string `gorm:"column:stripe_customer_id"`
		Livemode         bool   `gorm:"column:livemode"`
	}
	if err := s.db.WithContext(ctx).Raw(`SELECT stripe_customer_id, livemode FROM customers
		WHERE user_id = $1 AND livemode = $2 AND stripe_customer_id IS NOT NULL`, userID, s.livemode).Scan(&cust).Error; err != nil {
		return nil, fmt.Errorf("load customer of user %q: %w", userID, err)
	}
	if len(cust) == 0 {
		return nil, ErrNoCustomer
	}
	c := cust[0]
	const columns = `invoice_id, number, status, amount_due, amount_paid, currency, period_start, period_end,
		hosted_invoice_url, invoice_pdf, created, subscription_id`
	var rows []InvoiceView
	var err error
	if startingAfter == "" {
		err = s.db.WithContext(ctx).Raw(`SELECT `+columns+` FROM invoices
			WHERE stripe_customer_id = $1 AND livemode = $2 AND status IS DISTINCT FROM 'draft'
			ORDER BY created DESC, invoice_id COLLATE "C" DESC LIMIT $3`, c.StripeCustomerID, c.Livemode, limit+1).Scan(&rows).Error
	} else {
		var cursor []InvoiceView
		if err := s.db.WithContext(ctx).Raw(`SELECT `+columns+` FROM invoices
			WHERE invoice_id = $1 AND stripe_customer_id = $2 AND livemode = $3`, startingAfter, c.StripeCustomerID, c.Livemode).
			Scan(&cursor).Error; err != nil {
			return nil, fmt.Errorf("load invoice %s: %w", startingAfter, err)
		}
		if len(cursor) == 0 {
			return nil, ErrUnknownInvoice
		}
		err = s.db.WithContext(ctx).Raw(`SELECT `+columns+` FROM invoices
			WHERE stripe_customer_id = $1 AND livemode = $2 AND status IS DISTINCT FROM 'draft'
			  AND (created, invoice_id COLLATE "C") < (CAST($3 AS timestamptz), CAST($4 AS text) COLLATE "C")
			ORDER BY created DESC, invoice_id COLLATE "C" DESC LIMIT $5`,
			c.StripeCustomerID, c.Livemode, cursor[0].Created, cursor[0].InvoiceID, limit+1).Scan(&rows).Error
	}
	if err != nil {
		return nil, fmt.Errorf("load invoices of user %q: %w", userID, err)
	}
	page := &InvoicePage{Invoices: rows[:min(len(rows), limit)], HasMore: len(rows) > limit}
	if page.Invoices == nil {
		page.Invoices = []InvoiceView{}
	}
	for i := range page.Invoices {
		v := &page.Invoices[i]
		v.PeriodStart, v.PeriodEnd, v.Created = UTC(v.PeriodStart), UTC(v.PeriodEnd), v.Created.UTC()
	}
	return page, nil
}

// getInvoices serves GET /v1/customers/{user_id}/invoices?limit=&starting_after=.
func (s *Service) getInvoices(c echo.Context) error {
	userID, err := userIDParam(c)
	if err != nil {
		return err
	}
	limit := defaultInvoiceLimit
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxInvoiceLimit {
			return apierr.New(apierr.CodeInvalidRequest, "limit must be an integer from 1 to %d", maxInvoiceLimit)
		}
		limit = n
	}
	after := c.QueryParam("starting_after")
	if after != "" && !ids.Valid(after) {
		return apierr.New(apierr.CodeInvalidRequest, "starting_after must be an invoice id")
	}
	page, err := s.Invoices(c.Request().Context(), userID, limit, after)
	if errors.Is(err, ErrUnknownInvoice) {
		return apierr.New(apierr.CodeInvalidRequest, "starting_after %s is not an invoice of user %s", after, userID)
	}
	if err != nil {
		return readError(err, userID)
	}
	return c.JSON(http.StatusOK, page)
}

// MountAPI adds, on the /v1 group (app-token auth applied by main):
//
//	GET /customers/:user_id/invoices     → InvoicePage (?limit=&starting_after=)
//
// The entitlement, the customer view and the features are the entitlements package's;
// GET /customers/:user_id's PUT (the link) is the customers package's.
func (s *Service) MountAPI(v1 *echo.Group) {
	v1.GET("/customers/:user_id/invoices", s.getInvoices)
}

// userIDParam validates the user id like PUT /v1/customers/{user_id} does (400 invalid_user_id).
func userIDParam(c echo.Context) (string, error) {
	id := c.Param("user_id")
	if err := ids.CheckUser(id); err != nil {
		return "", err
	}
	return id, nil
}

// readError answers a failed read: 404 for an unknown user, 503 when the database is down.
func readError(err error, userID string) error {
	if errors.Is(err, ErrNoCustomer) {
		return apierr.New(apierr.CodeNotFound, "no customer for user %q", userID)
	}
	return database.APIError(err, "load customer "+userID)
}
