package admin

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"billing/billing"
	"billing/internal/database"
	"billing/internal/display"
	"billing/reconcile"
)

// The overview lists at most this many holds and dead letters; the holds and dead-letter pages
// have them all.
const (
	overviewHolds       = 50
	overviewDeadLetters = 25
	// lagWindow is how far back the processing lag is measured.
	lagWindow = time.Hour
)

type overview struct {
	HoldCount    int
	HoldsShown   []holdRow
	HoldsMore    int
	HoldsByCause []countLink
	// HoldsByStatus counts the held subscriptions by Stripe status: a past_due hold reason and a
	// past_due status are different things (a failed payment holds an active subscription too).
	HoldsByStatus []countLink

	DeadLettersAvailable bool
	DeadLettersError     string
	DeadLetters          []deadLetterRow
	DeadLetterCount      int64
	DeadLettersMore      bool

	Stats      *statsView
	StatsError string

	Reconcile *reconcileView
}

type countLink struct {
	Label string
	Count int
	URL   string
}

type statsView struct {
	Waiting       int64
	OldestWaiting string
	OldestAge     string
	LagEvents     int64
	LagMedian     string
	LagMax        string
	LagWindow     string
}

// driftShown is how many drift rows the overview lists.
const driftShown = 20

type reconcileView struct {
	Available bool
	Error     string
	Run       *reconcile.LastRunView
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

func (c *Console) getOverview(ec echo.Context) error {
	ctx := ec.Request().Context()
	holds, err := c.d.Holds.Holds(ctx)
	if err != nil {
		return database.APIError(err, "build admin page")
	}
	v := &overview{HoldCount: len(holds)}
	for i, h := range holds {
		if i == overviewHolds {
			v.HoldsMore = len(holds) - overviewHolds
			break
		}
		v.HoldsShown = append(v.HoldsShown, holdRowOf(h))
	}
	byReason := map[string]int{}
	for _, h := range holds {
		byReason[h.HoldReason]++
	}
	for _, r := range []string{billing.HoldPaymentFailed, billing.HoldPastDue, billing.HoldUnpaid} {
		v.HoldsByCause = append(v.HoldsByCause, countLink{Label: r, Count: byReason[r], URL: pathHolds + "?reason=" + r})
	}
	byStatus := map[string]int{billing.StatusPastDue: 0, billing.StatusUnpaid: 0}
	for _, h := range holds {
		byStatus[h.Status]++
	}
	for _, st := range sortedKeys(byStatus) {
		v.HoldsByStatus = append(v.HoldsByStatus, countLink{Label: st, Count: byStatus[st], URL: pathHolds + "?status=" + st})
	}

	if c.d.DeadLetters != nil {
		v.DeadLettersAvailable = true
		dls, err := c.d.DeadLetters.DeadLetters(ctx, overviewDeadLetters+1)
		if err != nil {
			// The holds are still worth showing; say what is missing instead of failing the page.
			c.log.ErrorContext(ctx, "admin page: load dead letters", "error", err)
			v.DeadLettersError = "Could not load dead-lettered events; see the service log."
		}
		if len(dls) > overviewDeadLetters {
			dls, v.DeadLettersMore = dls[:overviewDeadLetters], true
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
	v.Stats, v.DeadLetterCount, v.StatsError = c.stats(ctx)
	v.Reconcile = c.reconcile(ctx)
	return c.render(ec, http.StatusOK, "overview", "overview", "Overview", v, "", "")
}

func (c *Console) stats(ctx context.Context) (*statsView, int64, string) {
	if c.d.Events == nil {
		return nil, 0, ""
	}
	now := c.now()
	s, err := c.d.Events.Stats(ctx, now.Add(-lagWindow))
	if err != nil {
		c.log.ErrorContext(ctx, "admin page: count backlog", "error", err)
		return nil, 0, "Could not count the backlog; see the service log."
	}
	v := &statsView{
		Waiting:   s.Waiting,
		LagEvents: s.LagEvents,
		LagMedian: seconds(s.LagMedian),
		LagMax:    seconds(s.LagMax),
		LagWindow: age(lagWindow),
	}
	if s.OldestWaiting != nil {
		v.OldestWaiting = when(s.OldestWaiting)
		v.OldestAge = age(now.Sub(*s.OldestWaiting))
	}
	return v, s.DeadLetters, ""
}

func (c *Console) reconcile(ctx context.Context) *reconcileView {
	if c.d.Reconcile == nil {
		return &reconcileView{}
	}
	run, err := c.d.Reconcile.LastRun(ctx, c.d.Livemode, driftShown)
	switch {
	case errors.Is(err, reconcile.ErrUnavailable):
		return &reconcileView{}
	case err != nil:
		c.log.ErrorContext(ctx, "admin page: last reconcile run", "error", err)
		return &reconcileView{Available: true, Error: "Could not read the reconcile runs; see the service log."}
	}
	return &reconcileView{Available: true, Run: run}
}

func holdRowOf(h billing.HoldView) holdRow {
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
	return row
}

// sortedKeys is the map's keys, sorted.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
