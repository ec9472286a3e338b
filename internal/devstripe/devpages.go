package devstripe

import (
	"html/template"
	"net/http"
	"net/url"
	"strings"

	"billing/internal/stripeemu"
)

// The pages a customer sees at the dev Stripe — a Checkout session's and a portal session's —
// with the forms that play what the customer does there.

// devCards are the test cards the pages offer.
var devCards = []struct{ PM, About string }{
	{"pm_card_visa", "Visa: succeeds"},
	{"pm_card_threeDSecure2Required", "3-D Secure: authenticated here, declines off-session renewals"},
	{"pm_card_chargeDeclined", "declines"},
	{"pm_card_chargeDeclinedInsufficientFunds", "declines: insufficient funds"},
}

var checkoutPageTemplate = template.Must(template.New("checkout").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Checkout (dev Stripe)</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 2em auto">
<h1>Checkout — dev Stripe</h1>
<p>This page stands in for Stripe Checkout in the dev loop. Paying here does what the customer
does at Stripe: the subscription starts and the service receives the events.</p>
<dl>
<dt>session</dt><dd><code>{{.ID}}</code></dd>
<dt>customer</dt><dd><code>{{.Customer}}</code></dd>
<dt>plan</dt><dd><code>{{.Price}}</code> × {{.Quantity}}{{with .Terms}} — {{.}}{{end}}</dd>
{{with .Promo}}<dt>promotion code</dt><dd><code>{{.}}</code></dd>{{end}}
<dt>status</dt><dd>{{.Status}}</dd>
</dl>
{{if eq .Status "open"}}
<form method="post" action="/dev/checkout/sessions/{{.ID}}/complete">
<input type="hidden" name="page" value="1">
<fieldset><legend>Card</legend>
{{range $i, $c := .Cards}}<label><input type="radio" name="card" value="{{$c.PM}}"{{if eq $i 0}} checked{{end}}> <code>{{$c.PM}}</code> — {{$c.About}}</label><br>
{{end}}</fieldset>
<p><button type="submit">Subscribe</button></p>
</form>
{{end}}
{{with .CancelURL}}<p><a href="{{.}}">Back to the app</a></p>{{end}}
</body></html>
`))

// checkoutPage serves a Checkout session's page (its url in Dev mode).
func (d *DevStripe) checkoutPage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s := d.Sessions.Get(id)
	if s == nil {
		http.Error(w, "no such checkout session in this dev Stripe (sessions live as long as the process)", http.StatusNotFound)
		return
	}
	f := d.Sessions.Request(id)
	data := struct {
		ID, Customer, Price, Quantity, Status, CancelURL, Terms, Promo string
		Cards                                                          any
	}{ID: id, Price: f.Get("line_items[0][price]"), Quantity: f.Get("line_items[0][quantity]"), Cards: devCards,
		Promo: f.Get("discounts[0][promotion_code]")}
	if t, ok := d.Proxy.PriceTerms(data.Price); ok {
		data.Terms = t.Name + ", " + stripeemu.Money(t.UnitAmount, t.Currency) + " a seat per " + t.Interval
	}
	data.Customer, _ = s["customer"].(string)
	data.Status, _ = s["status"].(string)
	data.CancelURL = webURL(str(s, "cancel_url"))
	if data.Quantity == "" {
		data.Quantity = "1"
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = checkoutPageTemplate.Execute(w, data)
}

// successURL is where Checkout sends the customer after paying: the session's success_url with
// {CHECKOUT_SESSION_ID} filled in ("" when it is not a web URL).
func successURL(s map[string]any) string {
	id, _ := s["id"].(string)
	return webURL(strings.ReplaceAll(str(s, "success_url"), "{CHECKOUT_SESSION_ID}", id))
}

// webURL is u when it is an http(s) URL a browser may be sent to, else "".
func webURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") {
		return ""
	}
	return u
}

// str is the string at path in a decoded object ("" when absent or not a string).
func str(m map[string]any, path ...string) string {
	var v any = m
	for _, k := range path {
		o, _ := v.(map[string]any)
		v = o[k]
	}
	s, _ := v.(string)
	return s
}
