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
		"cancel_at_period_end":false,"trial_end":null,"unconfirmed_since":null,"quantity":3,"features":["pro"],"extra":"fields may be added"}`
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
	// Still required: the key is always there, null or not.
	missing := []byte(`{"order_id":"order_1","status":"pending","amount":1250,"currency":"eur","idempotency_key":"charge-order_1"}`)
	if err := CheckResponse("GET", "/v1/charges/order_1", 200, "application/json", missing); err == nil {
		t.Error("a charge without payment_intent_id accepted")
	}
}
