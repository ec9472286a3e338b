package openapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"billing/appevents"
	"billing/billing"
	"billing/entitlements"
	"billing/internal/audit"
	"billing/reconcile"
	"billing/webhooks"
)

// The document is OpenAPI 3.1, every reference in it resolves, and every operation declares the
// parameters of its path and answers something.
func TestDocumentIsWellFormed(t *testing.T) {
	if doc["openapi"] != "3.1.0" {
		t.Errorf("openapi %v, want 3.1.0", doc["openapi"])
	}
	for _, ref := range Refs() {
		if Lookup(ref) == nil {
			t.Errorf("$ref %s resolves to nothing", ref)
		}
	}
	ops := Operations()
	if len(ops) < 10 {
		t.Fatalf("only %d operations", len(ops))
	}
	param := regexp.MustCompile(`\{([^}]+)\}`)
	for _, op := range ops {
		item := obj(obj(doc["paths"])[op.Path])
		o := obj(item[strings.ToLower(op.Method)])
		if len(obj(o["responses"])) == 0 {
			t.Errorf("%s %s answers nothing", op.Method, op.Path)
		}
		declared := map[string]bool{}
		for _, p := range append(list(item["parameters"]), list(o["parameters"])...) {
			if p := obj(resolve(p)); p["in"] == "path" {
				declared[p["name"].(string)] = true
			}
		}
		inPath := map[string]bool{}
		for _, m := range param.FindAllStringSubmatch(op.Path, -1) {
			inPath[m[1]] = true
			if !declared[m[1]] {
				t.Errorf("%s %s: path parameter %s not declared", op.Method, op.Path, m[1])
			}
		}
		for name := range declared {
			if !inPath[name] {
				t.Errorf("%s %s: declares path parameter %s it does not have", op.Method, op.Path, name)
			}
		}
	}
}

func decode(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The checker accepts what fits and refuses each kind of misfit it claims to catch.
func TestValidateRefusesWhatDoesNotFit(t *testing.T) {
	ent, ok := Schema("Entitlement")
	if !ok {
		t.Fatal("no Entitlement schema")
	}
	good := `{"user_id":"u1","entitled":true,"status":"active","on_hold":false,"hold_reason":null,
		"subscription_id":"sub_1","price_id":null,"current_period_end":"2026-01-02T03:04:05Z",
		"cancel_at_period_end":false,"trial_end":null,"unconfirmed_since":null,"quantity":3,"features":["pro"]}`
	if errs := Validate(ent, decode(t, good)); len(errs) != 0 {
		t.Fatalf("a fitting entitlement refused: %v", errs)
	}
	for name, tc := range map[string]struct{ from, to, want string }{
		"missing field":     {`"user_id":"u1",`, ``, `required field "user_id"`},
		"wrong type":        {`"entitled":true`, `"entitled":"yes"`, `$.entitled`},
		"null not allowed":  {`"status":"active"`, `"status":null`, `$.status`},
		"bad date-time":     {`"2026-01-02T03:04:05Z"`, `"yesterday"`, `RFC 3339`},
		"not an object":     {good, `[]`, `not of type`},
		"nullable, a type":  {`"price_id":null`, `"price_id":5`, `$.price_id`},
		"boolean for null?": {`"trial_end":null`, `"trial_end":false`, `$.trial_end`},
		"array of a type":   {`["pro"]`, `[1]`, `$.features`},
		"undocumented":      {`"quantity":3,`, `"quantity":3,"seats":3,`, `$: field "seats" is not in the document`},
	} {
		bad := strings.Replace(good, tc.from, tc.to, 1)
		errs := Validate(ent, decode(t, bad))
		if len(errs) == 0 || !strings.Contains(errorsText(errs), tc.want) {
			t.Errorf("%s: errors %v, want one about %s", name, errs, tc.want)
		}
	}
	charge, _ := Schema("ChargeRequest")
	if errs := Validate(charge, decode(t, `{"order_id":"o","user_id":"u","amount":1.5,"currency":"eur"}`)); len(errs) == 0 {
		t.Error("a fractional integer accepted")
	}
	if errs := Validate(charge, decode(t, `{"order_id":"o","user_id":"u","amount":0,"currency":"eur"}`)); len(errs) == 0 {
		t.Error("an amount below the minimum accepted")
	}
	hook, _ := Schema("WebhookAnswer")
	if errs := Validate(hook, decode(t, `{"status":"maybe"}`)); len(errs) == 0 {
		t.Error("a status outside the enum accepted")
	}
	list, _ := Schema("InvoiceList")
	if errs := Validate(list, decode(t, `{"invoices":[{"invoice_id":1}],"has_more":false}`)); len(errs) == 0 || !strings.Contains(errorsText(errs), "$.invoices[0]") {
		t.Errorf("an item of the wrong shape: %v", errs)
	}
	detail, _ := Schema("EventDetail")
	if errs := Validate(detail, decode(t, `{"event_id":"evt_1"}`)); !strings.Contains(errorsText(errs), `"payload"`) || !strings.Contains(errorsText(errs), `"type"`) {
		t.Errorf("allOf parts not both checked: %v", errs)
	}
}

func errorsText(errs []error) string {
	var b strings.Builder
	for _, e := range errs {
		b.WriteString(e.Error() + "\n")
	}
	return b.String()
}

func TestCheckResponse(t *testing.T) {
	okBody := []byte(`{"status":"ok"}`)
	if err := CheckResponse("GET", "/healthz", 200, "application/json; charset=UTF-8", okBody); err != nil {
		t.Errorf("a documented answer refused: %v", err)
	}
	for name, tc := range map[string]struct {
		method, path string
		status       int
		ctype, body  string
		want         string
	}{
		"unknown path":        {"GET", "/nope", 200, "application/json", `{}`, "not in the document"},
		"unknown method":      {"DELETE", "/healthz", 200, "application/json", `{}`, "not in the document"},
		"undocumented status": {"GET", "/healthz", 500, "application/json", `{}`, "not documented"},
		"wrong content type":  {"GET", "/healthz", 200, "text/plain", `ok`, "content type"},
		"body not JSON":       {"GET", "/healthz", 200, "application/json", `ok`, "not JSON"},
		"schema misfit":       {"GET", "/healthz", 200, "application/json", `{}`, `"status"`},
		"error misfit":        {"GET", "/v1/customers/u1", 404, "application/json", `{"code":"x"}`, `"error"`},
	} {
		err := CheckResponse(tc.method, tc.path, tc.status, tc.ctype, []byte(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %s", name, err, tc.want)
		}
	}
	if err := CheckResponse("POST", "/v1/customers/u1/subscriptions/sub_1/cancel", 303, "", nil); err != nil {
		t.Errorf("a redirect without a body refused: %v", err)
	}
}

func TestMatchPrefersLiteralSegments(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "/admin/events/evt_1", "/admin/events/{event_id}"},
		{"GET", "/admin/reconcile/runs", "/admin/reconcile/runs"},
		{"GET", "/v1/customers/u1", "/v1/customers/{user_id}"},
		{"GET", "/v1/customers/u1/entitlement", "/v1/customers/{user_id}/entitlement"},
		{"POST", "/v1/customers/u1/subscriptions/s1/cancel", "/v1/customers/{user_id}/subscriptions/{subscription_id}/cancel"},
		{"GET", "/admin/ui/dead-letters/replay-type", "/admin/ui/dead-letters/replay-type"},
		{"GET", "/v1/checkout-sessions/cs_test_a1b2c3", "/v1/checkout-sessions/{session_id}"},
	} {
		if got, ok := Match(tc.method, tc.path); !ok || got != tc.want {
			t.Errorf("%s %s matched %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
	if _, ok := Match("GET", "/v1/customers/"); ok {
		t.Error("an empty parameter matched")
	}
}

// Mount serves the document as JSON, to anyone.
func TestMountServesTheDocument(t *testing.T) {
	e := echo.New()
	Mount(e)
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		t.Fatalf("GET %s: %d %s", Path, rec.Code, rec.Header().Get("Content-Type"))
	}
	if !bytes.Equal(rec.Body.Bytes(), JSON()) {
		t.Error("served document differs from JSON()")
	}
	if err := CheckResponse("GET", Path, rec.Code, rec.Header().Get("Content-Type"), rec.Body.Bytes()); err != nil {
		t.Error(err)
	}
}

// GET /v1/charges/{order_id} of a row still pending has no PaymentIntent yet: its
// payment_intent_id is null, and the document must say so.
func TestPendingChargeFitsTheDocument(t *testing.T) {
	pending := []byte(`{"order_id":"order_1","status":"pending","payment_intent_id":null,"amount":1250,"currency":"eur",` +
		`"idempotency_key":"charge-order_1","decline_code":null,"amount_refunded":0,"livemode":false}`)
	if err := CheckResponse("GET", "/v1/charges/order_1", 200, "application/json", pending); err != nil {
		t.Errorf("a pending charge refused: %v", err)
	}
	// The fields only GET adds are the ledger row's, not POST's answer.
	posted := []byte(`{"order_id":"order_1","status":"succeeded","payment_intent_id":"pi_1","amount":1250,"currency":"eur",` +
		`"idempotency_key":"charge-order_1","livemode":false}`)
	if err := CheckResponse("POST", "/v1/charges", 201, "application/json", posted); err == nil || !strings.Contains(err.Error(), `field "livemode"`) {
		t.Errorf("POST /v1/charges with a field of GET's: %v", err)
	}
	// Still required: the key is always there, null or not.
	missing := []byte(`{"order_id":"order_1","status":"pending","amount":1250,"currency":"eur","idempotency_key":"charge-order_1"}`)
	if err := CheckResponse("GET", "/v1/charges/order_1", 200, "application/json", missing); err == nil {
		t.Error("a charge without payment_intent_id accepted")
	}
}

func schemaOf(t *testing.T, s string) any {
	t.Helper()
	return decode(t, s)
}

// An object may carry only the members its schema declares, at any depth, unless
// additionalProperties allows the others (true) or describes them (a schema they must fit).
func TestValidateRefusesUndocumentedMembers(t *testing.T) {
	closed := schemaOf(t, `{"type":"object","properties":{"a":{"type":"integer"},
		"inner":{"type":"object","properties":{"b":{"type":"string"}}},
		"list":{"type":"array","items":{"type":"object","properties":{"c":{"type":"boolean"}}}}}}`)
	for name, tc := range map[string]struct{ body, want string }{
		"top level":  {`{"a":1,"z":2}`, `$: field "z" is not in the document`},
		"nested":     {`{"inner":{"b":"x","y":1}}`, `$.inner: field "y" is not in the document`},
		"in an item": {`{"list":[{"c":true},{"c":false,"d":0}]}`, `$.list[1]: field "d" is not in the document`},
	} {
		errs := Validate(closed, decode(t, tc.body))
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
			t.Errorf("%s: errors %v, want only %s", name, errs, tc.want)
		}
	}
	if errs := Validate(closed, decode(t, `{"a":1,"inner":{"b":"x"},"list":[{"c":true}]}`)); len(errs) != 0 {
		t.Errorf("declared members refused: %v", errs)
	}

	open := schemaOf(t, `{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true}`)
	if errs := Validate(open, decode(t, `{"a":1,"z":{"anything":[1,"x"]}}`)); len(errs) != 0 {
		t.Errorf("additionalProperties: true, a member refused: %v", errs)
	}
	if errs := Validate(open, decode(t, `{"a":"one"}`)); len(errs) != 1 {
		t.Errorf("additionalProperties: true, a declared member of the wrong type: %v", errs)
	}

	typed := schemaOf(t, `{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":{"type":"integer","minimum":0}}`)
	if errs := Validate(typed, decode(t, `{"a":"x","n":1,"m":2}`)); len(errs) != 0 {
		t.Errorf("members fitting additionalProperties refused: %v", errs)
	}
	if errs := Validate(typed, decode(t, `{"a":"x","n":"one","m":-1}`)); len(errs) != 2 ||
		!strings.Contains(errorsText(errs), "$.n:") || !strings.Contains(errorsText(errs), "$.m: -1 is below 0") {
		t.Errorf("members misfitting additionalProperties: %v, want errors at $.n and $.m", errs)
	}
	asMap := schemaOf(t, `{"type":"object","additionalProperties":{"type":"string"}}`)
	if errs := Validate(asMap, decode(t, `{"x":"1","y":2}`)); len(errs) != 1 || !strings.Contains(errs[0].Error(), "$.y") {
		t.Errorf("a map of strings with a number: %v", errs)
	}
	none := schemaOf(t, `{"type":"object","additionalProperties":false}`)
	if errs := Validate(none, decode(t, `{"x":1}`)); len(errs) != 1 {
		t.Errorf("additionalProperties: false took a member: %v", errs)
	}

	// Without properties an object is free-form, as the document's own schema and Stripe's
	// payloads are.
	free := schemaOf(t, `{"type":"object","required":["openapi"]}`)
	if errs := Validate(free, decode(t, `{"openapi":"3.1.0","anything":{"at":["all"]}}`)); len(errs) != 0 {
		t.Errorf("a free-form object refused: %v", errs)
	}
	if err := CheckResponse("GET", Path, 200, "application/json", JSON()); err != nil {
		t.Errorf("the document does not fit its own free-form schema: %v", err)
	}
}

// A member declared by any allOf branch is known to the whole; one declared by none is reported
// once, not once per branch.
func TestValidateKnowsTheMembersOfAllOf(t *testing.T) {
	both := schemaOf(t, `{"allOf":[{"type":"object","properties":{"a":{"type":"integer"}}},
		{"type":"object","properties":{"b":{"type":"string"}}}]}`)
	if errs := Validate(both, decode(t, `{"a":1,"b":"x"}`)); len(errs) != 0 {
		t.Errorf("members of two allOf branches refused: %v", errs)
	}
	if errs := Validate(both, decode(t, `{"a":1,"b":"x","c":true}`)); len(errs) != 1 || !strings.Contains(errs[0].Error(), `field "c"`) {
		t.Errorf("a member of no branch: %v, want one error about c", errs)
	}
	if errs := Validate(both, decode(t, `{"a":"1","b":2}`)); len(errs) != 2 {
		t.Errorf("each branch checks its members' values: %v", errs)
	}

	// The document's own allOf, through $ref: a review record has the Usage fields and its own.
	review, _ := Schema("UsageReview")
	item := `{"usage_id":"u1","meter":"api_calls","value":3,"timestamp":"2026-01-02T03:04:05Z","status":"needs_review",
		"identifier":"usage-user_1-u1","user_id":"user_1","stripe_customer_id":"cus_1","attempts":2,
		"first_attempt_at":null,"last_attempt_at":null,"error_code":null,"review_since":null}`
	if errs := Validate(review, decode(t, item)); len(errs) != 0 {
		t.Errorf("a review record refused: %v", errs)
	}
	if errs := Validate(review, decode(t, strings.Replace(item, `"attempts":2`, `"attempts":2,"tries":2`, 1))); len(errs) != 1 {
		t.Errorf("a review record with an undocumented member: %v, want one error", errs)
	}
	// EventDetail's payload is Stripe's event: free-form, whatever it holds.
	detail, _ := Schema("EventDetail")
	ev := `{"event_id":"evt_1","type":"invoice.paid","status":"processed","livemode":false,"api_version":"2024-06-20",
		"attempts":1,"received_at":"2026-01-02T03:04:05Z","processed_at":null,"failure_reason":null,
		"payload":{"id":"evt_1","data":{"object":{"id":"in_1","lines":{"data":[]}}}}}`
	if errs := Validate(detail, decode(t, ev)); len(errs) != 0 {
		t.Errorf("an event with its payload refused: %v", errs)
	}
}

// A member declared by the oneOf/anyOf branch the value fits is known; one declared only by a
// branch it does not fit is not. A oneOf must fit exactly one branch, an anyOf at least one.
func TestValidateOneOfAndAnyOf(t *testing.T) {
	for _, kw := range []string{"oneOf", "anyOf"} {
		s := schemaOf(t, `{"type":"object","properties":{"kind":{"type":"string"}},"`+kw+`":[
			{"required":["card"],"properties":{"card":{"type":"string"}}},
			{"required":["iban"],"properties":{"iban":{"type":"string"}}}]}`)
		if errs := Validate(s, decode(t, `{"kind":"x","card":"4242"}`)); len(errs) != 0 {
			t.Errorf("%s: members of the fitting branch refused: %v", kw, errs)
		}
		if errs := Validate(s, decode(t, `{"kind":"x","card":"4242","bic":"x"}`)); len(errs) != 1 || !strings.Contains(errs[0].Error(), `field "bic"`) {
			t.Errorf("%s: an undeclared member: %v, want one error about bic", kw, errs)
		}
		if errs := Validate(s, decode(t, `{"kind":"x"}`)); len(errs) != 1 || !strings.Contains(errs[0].Error(), "fits none of the "+kw) {
			t.Errorf("%s: a value fitting no branch: %v", kw, errs)
		}
		both := Validate(s, decode(t, `{"card":"4242","iban":"DE"}`))
		if kw == "oneOf" && (len(both) != 1 || !strings.Contains(both[0].Error(), "fits 2 of the oneOf")) {
			t.Errorf("oneOf: a value fitting both branches: %v", both)
		}
		if kw == "anyOf" && len(both) != 0 {
			t.Errorf("anyOf: a value fitting both branches refused: %v", both)
		}
	}
	// The document's oneOf: a usage timestamp is a date-time or Unix seconds.
	usage, _ := Schema("UsageRequest")
	for body, ok := range map[string]bool{
		`{"usage_id":"u","meter":"m","value":1,"timestamp":"2026-01-02T03:04:05Z"}`: true,
		`{"usage_id":"u","meter":"m","value":1,"timestamp":1767323045}`:             true,
		`{"usage_id":"u","meter":"m","value":1,"timestamp":"yesterday"}`:            false,
		`{"usage_id":"u","meter":"m","value":1,"timestamp":true}`:                   false,
	} {
		if errs := Validate(usage, decode(t, body)); (len(errs) == 0) != ok {
			t.Errorf("%s: errors %v, want ok=%v", body, errs, ok)
		}
	}
}

// The structs that encode answers, as they encode: each member is always there (no omitempty
// but a detail's payload), so a field added to one fails here until the document describes it,
// whether or not a test of package main meets a value of it. Slices are set because a nil one
// encodes as null; the unexported answers (charges, usage, checkout) are met by package main's
// tests.
func TestAnswerStructsFitTheDocument(t *testing.T) {
	ent := entitlements.Entitlement{Features: []string{}}
	one := int64(1)
	ev := webhooks.EventView{Status: "processed"}
	withPayload := ev
	withPayload.Payload = json.RawMessage(`{"id":"evt_1","data":{"object":{}}}`)
	for name, tc := range map[string]struct {
		schema string
		value  any
	}{
		"Entitlement":   {"Entitlement", ent},
		"Subscription":  {"Subscription", entitlements.SubscriptionView{Quantity: &one}},
		"Customer":      {"Customer", entitlements.CustomerView{Subscriptions: []entitlements.SubscriptionView{{}}, Entitlement: ent}},
		"Hold":          {"Hold", billing.HoldView{}},
		"InvoiceList":   {"InvoiceList", billing.InvoicePage{Invoices: []billing.InvoiceView{{}}}},
		"Feature":       {"Feature", entitlements.FeatureAnswer{}},
		"Event":         {"Event", ev},
		"EventDetail":   {"EventDetail", withPayload},
		"ReconcileRun":  {"ReconcileRun", reconcile.RunView{}},
		"Drift":         {"Drift", reconcile.DriftView{}},
		"AppEvent":      {"AppEvent", appevents.Body{Type: appevents.TypeEntitlementUpdated, Sequence: 1, Data: json.RawMessage(`{}`)}},
		"AppEventPage":  {"AppEventPage", appevents.Page{Events: []appevents.Body{{Type: appevents.TypeChargeUpdated, Sequence: 1, Data: json.RawMessage(`{}`)}}}},
		"AdminAppEvent": {"AdminAppEvent", appevents.AdminEvent{Status: "pending"}},
	} {
		schema, ok := Schema(tc.schema)
		if !ok {
			t.Fatalf("no schema %s", tc.schema)
		}
		b, err := json.Marshal(tc.value)
		if err != nil {
			t.Fatal(err)
		}
		if errs := Validate(schema, decode(t, string(b))); len(errs) != 0 {
			t.Errorf("%s: %s does not fit the document: %v", name, b, errs)
		}
	}
	// The audit log's page is described inline, under its path.
	b, _ := json.Marshal(audit.Page{Entries: []audit.Entry{{}}})
	if err := CheckResponse("GET", "/admin/audit", 200, "application/json", b); err != nil {
		t.Error(err)
	}
}
