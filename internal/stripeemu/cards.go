package stripeemu

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
)

// cardOutcome is what Stripe's test mode does with a confirmation on one of its test cards.
type cardOutcome struct {
	code, declineCode, message string
	// authenticate: the card demands 3-D Secure, which a server-side confirmation cannot do.
	authenticate bool
}

// testCards are Stripe's test payment methods by name: pm_card_<name> and tok_<name> behave
// alike. A name not listed here (pm_card_visa, tok_mastercard, …) is a working card.
var testCards = map[string]cardOutcome{
	"chargeDeclined":                      {code: "card_declined", declineCode: "generic_decline", message: "Your card was declined."},
	"chargeDeclinedInsufficientFunds":     {code: "card_declined", declineCode: "insufficient_funds", message: "Your card has insufficient funds."},
	"chargeDeclinedLostCard":              {code: "card_declined", declineCode: "lost_card", message: "Your card was declined."},
	"chargeDeclinedStolenCard":            {code: "card_declined", declineCode: "stolen_card", message: "Your card was declined."},
	"chargeDeclinedFraudulent":            {code: "card_declined", declineCode: "fraudulent", message: "Your card was declined."},
	"chargeDeclinedVelocityLimitExceeded": {code: "card_declined", declineCode: "card_velocity_exceeded", message: "Your card was declined."},
	"chargeDeclinedExpiredCard":           {code: "expired_card", message: "Your card has expired."},
	"chargeDeclinedIncorrectCvc":          {code: "incorrect_cvc", message: "Your card's security code is incorrect."},
	"chargeDeclinedProcessingError":       {code: "processing_error", message: "An error occurred while processing your card. Try again in a little bit."},
	"threeDSecure2Required":               {authenticate: true},
	"threeDSecureRequired":                {authenticate: true},
	"authenticationRequired":              {authenticate: true},
	"authenticationRequiredOnSetup":       {authenticate: true},
}

// TestCards returns the payment method ids the proxy treats as Stripe's test cards that do not
// simply succeed (pm_card_<name>; tok_<name> works the same), sorted.
func TestCards() []string {
	out := make([]string, 0, len(testCards))
	for name := range testCards {
		out = append(out, "pm_card_"+name)
	}
	sort.Strings(out)
	return out
}

// testCard returns the outcome of charging the payment method id, and false for a working card.
func testCard(id string) (cardOutcome, bool) {
	name, ok := strings.CutPrefix(id, "pm_card_")
	if !ok {
		name, ok = strings.CutPrefix(id, "tok_")
	}
	if !ok {
		return cardOutcome{}, false
	}
	out, ok := testCards[name]
	return out, ok
}

// confirmPaymentIntent settles a PaymentIntent created with confirm=true the way test mode does
// for its payment method (or the customer's default source when none is given): a working card
// succeeds, a declining one answers 402 card_error with the failed PaymentIntent, a 3-D Secure
// one needs an action (on-session) or answers 402 authentication_required (off-session, where
// the customer is not there to authenticate). pi is stripe-mock's answer with our id; it is
// changed in place and kept by the caller. ok is false when the answer is pi itself (200).
func (p *Proxy) confirmPaymentIntent(req Request, pi map[string]any) (status int, body []byte, ok bool) {
	pm := req.Form.Get("payment_method")
	if pm == "" {
		pm = p.defaultSource(req.Form.Get("customer"))
	}
	if pm != "" {
		pi["payment_method"] = pm
	}
	pi["last_payment_error"] = nil
	pi["next_action"] = nil
	out, special := testCard(pm)
	switch {
	case !special:
		pi["status"] = "succeeded"
		return 0, nil, false
	case out.authenticate && req.Form.Get("off_session") != "true":
		pi["status"] = "requires_action"
		pi["next_action"] = map[string]any{"type": "use_stripe_sdk", "use_stripe_sdk": map[string]any{"type": "three_d_secure_redirect"}}
		return 0, nil, false
	case out.authenticate:
		pi["status"] = "requires_action"
		out = cardOutcome{code: "authentication_required", declineCode: "authentication_required",
			message: "Your card was declined. This transaction requires authentication."}
	default:
		pi["status"] = "requires_payment_method"
	}
	e := map[string]any{"type": "card_error", "code": out.code, "message": out.message,
		"payment_method": map[string]any{"id": pm, "object": "payment_method", "type": "card"}}
	if out.declineCode != "" {
		e["decline_code"] = out.declineCode
	}
	last := map[string]any{}
	for k, v := range e {
		last[k] = v
	}
	pi["last_payment_error"] = last
	e["payment_intent"] = pi
	b, _ := json.Marshal(map[string]any{"error": e})
	return http.StatusPaymentRequired, b, true
}

// defaultSource is the default_source of a customer created through the proxy or kept by its
// Account ("" if unknown).
func (p *Proxy) defaultSource(customerID string) string {
	if customerID == "" {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.customerSource != nil {
		if s := p.customerSource(customerID); s != "" {
			return s
		}
	}
	for _, c := range p.objects["/v1/customers"] {
		if c["id"] == customerID {
			s, _ := c["default_source"].(string)
			return s
		}
	}
	return ""
}

// CardDeclines reports whether charging pm fails off-session and at Checkout. A card that needs
// 3-D Secure is authenticated by the customer at Checkout, but not at a renewal, where nobody is
// there to.
func CardDeclines(pm string, offSession bool) bool {
	out, special := testCard(pm)
	return special && (!out.authenticate || offSession)
}
