// Package devstripe is the dev Stripe of `make run` (its program: cmd/devstripe): the tests'
// emulator (internal/stripeemu) in front of stripe-mock, made into an account a person can use —
// Dev's hooks (kept customers, a default test card, local portal pages, ids unique across
// restarts), an account on a test clock, Checkout pages, a seeded catalog, a subscription's life
// (renewals, retries, portal changes) and the sender of its events to the service. It attaches to
// the emulator only through what the emulator exports (Hooks, SetIDTag, the accounts' setters), so
// that the emulator has no dev mode of its own.
package devstripe

import (
	"net/http"
	"sync"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
)

// DevStripe is the Stripe of the dev loop (`make run`, cmd/devstripe): the proxy in Dev mode
// with state, so that what the service creates is what it reads back — customers, subscriptions
// and invoices in an Account, Checkout sessions, meter events — instead of stripe-mock's fixture
// of another customer — and a seeded Catalog (devcatalog.go) whose prices its invoices bill, with
// prorations of plan changes, promotion codes and the entitlements of the products' features.
// Charges, refunds and portal sessions still go through stripe-mock and Dev mode's test cards.
type DevStripe struct {
	Proxy    *stripeemu.Proxy
	Account  *stripeemu.Account
	Sessions *stripeemu.CheckoutSessions
	Meter    *stripeemu.MeterEvents
	// Catalog is the products, prices and promotion codes (seeded: seedDevCatalog).
	Catalog *stripeemu.Catalog
	// Webhooks delivers the events of what happens here to the service; nil: none are sent.
	Webhooks *WebhookSender

	mu      sync.Mutex        // one dev action at a time: its changes and events stay in order
	pending map[string]string // session → its incomplete subscription (a declined Checkout)
	// billedUsage: the meter events (by identifier) an invoice has billed.
	billedUsage map[string]bool
}

// NewDevStripe puts p in Dev mode and mounts the dev loop's state on it (test mode).
func NewDevStripe(p *stripeemu.Proxy) *DevStripe {
	// Dev first: the account and the sessions take its id tag.
	Dev(p)
	d := &DevStripe{
		Proxy:    p,
		Account:  newDevAccount(p),
		Sessions: stripeemu.NewCheckoutSessions(p, false),
		Meter:    stripeemu.NewMeterEvents(p, false),
		pending:  map[string]string{},

		billedUsage: map[string]bool{},
	}
	d.Catalog = stripeemu.NewCatalog(p, false)
	seedDevCatalog(d.Catalog, d.Account.Now())
	// Promotion codes expire by the test clock.
	d.Catalog.SetClock(d.Account.Now)
	d.Sessions.SetPageBase(PortalBase(p) + "/dev/checkout/sessions/")
	// The portal's pages apply what the customer confirms; /dev/ is the dev actions' endpoints.
	pages := http.NewServeMux()
	pages.Handle(devPortalPath, portalPages(p, true))
	pages.Handle("/dev/", d.serveDev())
	h := p.Hooks()
	h.Pages, h.PagePrefixes = pages, []string{devPortalPath, "/dev/"}
	p.SetHooks(h)
	return d
}

// newDevAccount is the dev loop's account: its clock is the wall clock moved on by Advance, and a
// new customer that names no payment method charges DefaultCard until a developer sets another.
func newDevAccount(p *stripeemu.Proxy) *stripeemu.Account {
	a := stripeemu.NewAccount(p, false)
	a.UseWallClock()
	a.SetNewCustomerCard(DefaultCard)
	return a
}

// event is an event of the pinned API version and test mode carrying obj, stamped with the
// account's clock (a test clock moves it on, as Stripe's test clocks do).
func (d *DevStripe) event(typ string, obj map[string]any, created time.Time) []byte {
	return stripeevents.Event(d.Proxy.NewID("evt_"), typ, created, false, obj, nil)
}
