package stripetest

// DevStripe is the Stripe of the dev loop (`make run`, internal/devstripe): the proxy in Dev mode
// with state, so that what the service creates is what it reads back — customers, subscriptions
// and invoices in an Account, Checkout sessions, meter events — instead of stripe-mock's fixture
// of another customer. Charges, refunds and portal sessions still go through stripe-mock and Dev
// mode's test cards.
type DevStripe struct {
	Proxy    *Proxy
	Account  *Account
	Sessions *CheckoutSessions
	Meter    *MeterEvents
}

// NewDevStripe puts p in Dev mode and mounts the dev loop's state on it (test mode).
func NewDevStripe(p *Proxy) *DevStripe {
	// Dev first: the account and the sessions take its id tag.
	p.Dev()
	return &DevStripe{
		Proxy:    p,
		Account:  NewAccount(p, false),
		Sessions: NewCheckoutSessions(p, false),
		Meter:    NewMeterEvents(p, false),
	}
}
