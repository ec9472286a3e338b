package portal

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"

	"billing/internal/stripeclient"
)

// Preview is POST …/change/preview: Stripe's preview of the invoice that the change brings,
// prorated by the time left in the period. Nothing is changed and nothing is stored.
type Preview struct {
	Currency  string `json:"currency"`
	AmountDue int64  `json:"amount_due"`
	Subtotal  int64  `json:"subtotal"`
	// Tax is Stripe Tax's amount (0 when no tax was computed).
	Tax   int64         `json:"tax"`
	Total int64         `json:"total"`
	Lines []PreviewLine `json:"lines"`
	// HasMoreLines: Stripe has more lines than its first page, which is what is shown.
	HasMoreLines  bool       `json:"has_more_lines"`
	NextPaymentAt *time.Time `json:"next_payment_at"`
	// ProrationDate is the moment the proration is computed for: a change confirmed later is
	// prorated a little less.
	ProrationDate time.Time `json:"proration_date"`
}

// PreviewLine is one line of the previewed invoice.
type PreviewLine struct {
	Description string    `json:"description"`
	Amount      int64     `json:"amount"`
	Proration   bool      `json:"proration"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	PriceID     *string   `json:"price_id"`
	Quantity    int64     `json:"quantity"`
}

// postPreview validates the change as postChange does and asks Stripe for the invoice it would
// bring (POST /v1/invoices/create_preview, which creates nothing): the item's new price and
// quantity, with prorations as of now.
func (s *Service) postPreview(c echo.Context) error {
	ch, err := s.parseChange(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	params := &stripe.InvoiceCreatePreviewParams{Customer: stripe.String(ch.cust.StripeID()), Subscription: stripe.String(ch.subID)}
	if ch.price != nil || ch.quantity != nil {
		item, err := s.subscriptionItem(ctx, ch.cust, ch.subID)
		if err != nil {
			return err
		}
		params.SubscriptionDetails = &stripe.InvoiceCreatePreviewSubscriptionDetailsParams{
			Items: []*stripe.InvoiceCreatePreviewSubscriptionDetailsItemParams{{ID: stripe.String(item.ID), Price: ch.price, Quantity: ch.quantity}},
			// Prorated as of Stripe's now, which is the test clock's for a customer on one: the
			// service's clock would put the proration outside a period the clock has moved on.
			ProrationBehavior: stripe.String(string(stripe.SubscriptionSchedulePhaseProrationBehaviorCreateProrations)),
		}
	}
	params.Context = ctx
	inv, err := s.stripe.Invoices.CreatePreview(params)
	if err != nil {
		return stripeclient.APIError(err, "preview the change")
	}
	at := s.now().UTC().Truncate(time.Second)
	if inv.SubscriptionProrationDate > 0 {
		at = time.Unix(inv.SubscriptionProrationDate, 0).UTC()
	}
	return c.JSON(http.StatusOK, previewOf(inv, at))
}

func previewOf(inv *stripe.Invoice, at time.Time) Preview {
	p := Preview{Currency: string(inv.Currency), AmountDue: inv.AmountDue, Subtotal: inv.Subtotal, Tax: inv.Tax,
		Total: inv.Total, Lines: []PreviewLine{}, ProrationDate: at}
	switch {
	case inv.NextPaymentAttempt > 0:
		t := time.Unix(inv.NextPaymentAttempt, 0).UTC()
		p.NextPaymentAt = &t
	case inv.DueDate > 0:
		t := time.Unix(inv.DueDate, 0).UTC()
		p.NextPaymentAt = &t
	}
	if inv.Lines != nil {
		p.HasMoreLines = inv.Lines.HasMore
		for _, l := range inv.Lines.Data {
			line := PreviewLine{Description: l.Description, Amount: l.Amount, Proration: l.Proration, Quantity: l.Quantity}
			if l.Period != nil {
				line.PeriodStart, line.PeriodEnd = time.Unix(l.Period.Start, 0).UTC(), time.Unix(l.Period.End, 0).UTC()
			}
			if l.Price != nil {
				line.PriceID = &l.Price.ID
			}
			p.Lines = append(p.Lines, line)
		}
	}
	return p
}
