package devstripe

import (
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"billing/internal/stripeemu"
)

// DefaultCard is the default payment method the proxy gives a new customer in Dev mode.
const DefaultCard = "pm_card_visa"

// devPortalPath is where Dev mode serves its stand-in of the Customer Portal.
const devPortalPath = "/dev-portal/"

// Dev makes p the Stripe of the dev loop (`make run`), on top of what it does for tests:
//
//   - customers created through it are kept: retrieving one answers the kept object, and an update
//     (POST /v1/customers/{id}) changes it — email, name, metadata,
//     invoice_settings[default_payment_method], source (kept as default_source);
//   - a new customer whose create names no payment method gets DefaultCard as its
//     invoice_settings.default_payment_method, so that charges succeed until a developer sets
//     another test card;
//   - a Customer Portal session's url is a page of the proxy itself
//     (http://localhost:PORT/dev-portal/bps_…) instead of stripe-mock's placeholder;
//   - ids are unique across processes (cus_proxy<start time>000001), as Stripe's are: the
//     service's database outlives a restart of the proxy, and a reused id would link two users
//     to one customer;
//   - a price the catalog does not know costs DevUnitAmount a month.
//
// It does so through the proxy's Hooks and SetIDTag: the emulator itself has no dev mode. Tests
// leave it off: they state every answer they depend on.
func Dev(p *stripeemu.Proxy) {
	p.SetIDTag(strconv.FormatInt(time.Now().UnixNano(), 36))
	p.SetHooks(stripeemu.Hooks{
		Created:  func(req stripeemu.Request, obj map[string]any) { devCreated(p, req, obj) },
		Answered: func(req stripeemu.Request, obj map[string]any) map[string]any { return devCustomer(p, req, obj) },
		Pages:    portalPages(p, false), PagePrefixes: []string{devPortalPath},
		// What every dev price cost before there was a catalog.
		UnknownPriceAmount: DevUnitAmount,
	})
}

// PortalBase is the base of the local portal pages: the proxy's URL, named localhost for a
// browser.
func PortalBase(p *stripeemu.Proxy) string {
	u, err := url.Parse(p.URL)
	if err != nil {
		return p.URL
	}
	if h := u.Hostname(); h == "127.0.0.1" || h == "::1" {
		u.Host = "localhost:" + u.Port()
	}
	return strings.TrimRight(u.String(), "/")
}

// devCreated completes an object created through the proxy in Dev mode.
func devCreated(p *stripeemu.Proxy, req stripeemu.Request, obj map[string]any) {
	switch req.Path {
	case "/v1/customers":
		settings, _ := obj["invoice_settings"].(map[string]any)
		if settings == nil {
			settings = map[string]any{}
			obj["invoice_settings"] = settings
		}
		obj["default_source"] = nil
		switch {
		case req.Form.Get("invoice_settings[default_payment_method]") != "":
			settings["default_payment_method"] = req.Form.Get("invoice_settings[default_payment_method]")
		case req.Form.Get("source") != "":
			// Stripe charges a customer's default source when a payment names no method.
			settings["default_payment_method"] = nil
			obj["default_source"] = req.Form.Get("source")
		default:
			settings["default_payment_method"] = DefaultCard
		}
		for _, k := range []string{"email", "name"} {
			if req.Form.Has(k) {
				obj[k] = req.Form.Get(k)
			}
		}
	case "/v1/billing_portal/sessions":
		id, _ := obj["id"].(string)
		obj["url"] = PortalBase(p) + devPortalPath + id
		obj["customer"] = req.Form.Get("customer")
		if r := req.Form.Get("return_url"); r != "" {
			obj["return_url"] = r
		}
		obj["flow"] = flowOf(req.Form)
	}
}

// flowOf is the flow_data of a portal session's create, as Stripe answers it ("flow").
func flowOf(form url.Values) any {
	typ := form.Get("flow_data[type]")
	if typ == "" {
		return nil
	}
	flow := map[string]any{"type": typ}
	if sub := form.Get("flow_data[subscription_cancel][subscription]"); sub != "" {
		flow["subscription_cancel"] = map[string]any{"subscription": sub}
	}
	if sub := form.Get("flow_data[subscription_update][subscription]"); sub != "" {
		flow["subscription_update"] = map[string]any{"subscription": sub}
	}
	if sub := form.Get("flow_data[subscription_update_confirm][subscription]"); sub != "" {
		var items []any
		for i := 0; ; i++ {
			k := "flow_data[subscription_update_confirm][items][" + strconv.Itoa(i) + "]"
			if !form.Has(k+"[id]") && !form.Has(k+"[price]") {
				break
			}
			item := map[string]any{"id": form.Get(k + "[id]"), "price": nullable(form.Get(k + "[price]")), "quantity": nil}
			if q, err := strconv.ParseInt(form.Get(k+"[quantity]"), 10, 64); err == nil {
				item["quantity"] = q
			}
			items = append(items, item)
		}
		flow["subscription_update_confirm"] = map[string]any{"subscription": sub, "items": items}
	}
	if r := form.Get("flow_data[after_completion][redirect][return_url]"); r != "" {
		flow["after_completion"] = map[string]any{"type": "redirect", "redirect": map[string]any{"return_url": r}}
	}
	return flow
}

// devCustomer answers a retrieve or an update of a kept customer in Dev mode (after stripe-mock
// accepted the request); anything else is left as stripe-mock answered it.
func devCustomer(p *stripeemu.Proxy, req stripeemu.Request, obj map[string]any) map[string]any {
	id, ok := strings.CutPrefix(req.Path, "/v1/customers/")
	if !ok || id == "" || strings.Contains(id, "/") {
		return obj
	}
	kept := p.UpdateKept("/v1/customers", id, func(kept map[string]any) {
		if req.Method == http.MethodPost {
			updateCustomer(kept, req.Form)
		}
	})
	if kept == nil {
		return obj
	}
	return kept
}

// updateCustomer applies an update's form to a kept customer.
func updateCustomer(kept map[string]any, form url.Values) {
	for _, k := range []string{"email", "name", "description"} {
		if form.Has(k) {
			kept[k] = form.Get(k)
		}
	}
	if form.Has("invoice_settings[default_payment_method]") {
		settings, _ := kept["invoice_settings"].(map[string]any)
		if settings == nil {
			settings = map[string]any{}
			kept["invoice_settings"] = settings
		}
		if pm := form.Get("invoice_settings[default_payment_method]"); pm != "" {
			settings["default_payment_method"] = pm
		} else {
			settings["default_payment_method"] = nil
		}
	}
	if form.Has("source") {
		kept["default_source"] = form.Get("source")
	}
	md, _ := kept["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
	}
	for k, v := range metadataOf(form) {
		if v == "" {
			delete(md, k)
		} else {
			md[k] = v
		}
	}
	kept["metadata"] = md
}

var portalPageTemplate = template.Must(template.New("portal").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Customer Portal (local stand-in)</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 2em auto">
<h1>Customer Portal — local stand-in</h1>
{{if .Apply}}<p>This page stands in for Stripe's Customer Portal in the dev loop: confirming here
does what the customer does in the portal, and the service receives the events.</p>
{{else}}<p>This page stands in for Stripe's Customer Portal: nothing here changes a subscription.
In test mode at Stripe, this session would open the real portal.</p>{{end}}
<dl>
<dt>session</dt><dd><code>{{.ID}}</code></dd>
<dt>customer</dt><dd><code>{{.Customer}}</code></dd>
{{with .Flow}}<dt>flow</dt><dd><code>{{.}}</code></dd>{{end}}
{{with .Subscription}}<dt>subscription</dt><dd><code>{{.}}</code></dd>{{end}}
{{with .Price}}<dt>new plan</dt><dd><code>{{.}}</code>{{with $.Quantity}} × {{.}}{{end}}</dd>{{end}}
</dl>
{{if .Apply}}
{{if and (ne .Flow "subscription_update_confirm") (ne .Flow "subscription_update")}}<form method="post" action="/dev/portal/sessions/{{.ID}}/apply">
<input type="hidden" name="page" value="1"><input type="hidden" name="action" value="cancel">
<p><button type="submit">Cancel the plan (at the end of the period)</button></p>
</form>{{end}}
{{if ne .Flow "subscription_cancel"}}<form method="post" action="/dev/portal/sessions/{{.ID}}/apply">
<input type="hidden" name="page" value="1"><input type="hidden" name="action" value="update">
<p><label>Plan <input name="price" value="{{.Price}}" placeholder="price_…"></label>
<label>Seats <input name="quantity" type="number" min="1" value="{{.Quantity}}"></label>
<button type="submit">Confirm the change</button></p>
</form>{{end}}
{{end}}
{{with .ReturnURL}}<p><a href="{{.}}">Return to the app</a></p>{{end}}
</body></html>
`))

// portalSession is a portal session made through the proxy (nil when unknown).
func portalSession(p *stripeemu.Proxy, id string) map[string]any {
	for _, s := range p.Objects("/v1/billing_portal/sessions") {
		if s["id"] == id {
			return s
		}
	}
	return nil
}

// portalReturnURL is where the portal sends the customer after a session's flow: its
// after_completion redirect, else its return_url ("" when neither is a web URL).
func portalReturnURL(p *stripeemu.Proxy, id string) string {
	sess := portalSession(p, id)
	if u := webURL(str(sess, "flow", "after_completion", "redirect", "return_url")); u != "" {
		return u
	}
	return webURL(str(sess, "return_url"))
}

// portalPages serves the local stand-in of a portal session's page; with apply (the dev Stripe's
// state, NewDevStripe), its forms apply a cancellation or a plan change.
func portalPages(p *stripeemu.Proxy, apply bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) { portalPage(p, w, hr, apply) })
}

func portalPage(p *stripeemu.Proxy, w http.ResponseWriter, hr *http.Request, apply bool) {
	id := strings.TrimPrefix(hr.URL.Path, devPortalPath)
	sess := portalSession(p, id)
	if sess == nil || hr.Method != http.MethodGet {
		http.Error(w, "no such portal session in this dev Stripe (sessions live as long as the process)", http.StatusNotFound)
		return
	}
	data := struct {
		ID, Customer, Flow, Subscription, Price, Quantity, ReturnURL string
		Apply                                                        bool
	}{ID: id, Apply: apply, ReturnURL: portalReturnURL(p, id)}
	data.Customer, _ = sess["customer"].(string)
	if flow, ok := sess["flow"].(map[string]any); ok {
		data.Flow, _ = flow["type"].(string)
		if f, ok := flow[data.Flow].(map[string]any); ok {
			data.Subscription, _ = f["subscription"].(string)
			if items, _ := f["items"].([]any); len(items) > 0 {
				item, _ := items[0].(map[string]any)
				data.Price = str(item, "price")
				if q, ok := item["quantity"].(int64); ok { // as flowOf keeps it
					data.Quantity = strconv.FormatInt(q, 10)
				}
			}
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = portalPageTemplate.Execute(w, data)
}
