package usage

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"billing/internal/apitest"
	"billing/internal/stripeemu"
)

const meterPath = "/v1/billing/meter_events"

// Every refusal before storage: a precise status and code, and nothing stored.
func TestPostValidation(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1", false)
	now := v.clock.Now()
	long := strings.Repeat("x", 100)
	for _, tc := range []struct {
		name   string
		user   string
		body   any
		status int
		code   string
	}{
		{"no usage_id", "u1", map[string]any{"meter": "api_calls", "value": 1}, 400, "invalid_usage_id"},
		{"usage_id not a string", "u1", map[string]any{"usage_id": 7, "meter": "api_calls", "value": 1}, 400, "invalid_usage_id"},
		{"usage_id with a space", "u1", map[string]any{"usage_id": "a b", "meter": "api_calls", "value": 1}, 400, "invalid_usage_id"},
		{"identifier over 100 characters", "u1", map[string]any{"usage_id": long, "meter": "api_calls", "value": 1}, 400, "invalid_usage_id"},
		{"no meter", "u1", map[string]any{"usage_id": "a", "value": 1}, 400, "invalid_meter"},
		{"meter with a slash", "u1", map[string]any{"usage_id": "a", "meter": "api/calls", "value": 1}, 400, "invalid_meter"},
		{"meter starting with a dot", "u1", map[string]any{"usage_id": "a", "meter": ".calls", "value": 1}, 400, "invalid_meter"},
		{"meter over 100 characters", "u1", map[string]any{"usage_id": "a", "meter": long + "x", "value": 1}, 400, "invalid_meter"},
		{"no value", "u1", map[string]any{"usage_id": "a", "meter": "api_calls"}, 400, "invalid_value"},
		{"value a string", "u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": "3"}, 400, "invalid_value"},
		{"value a fraction", "u1", `{"usage_id":"a","meter":"api_calls","value":1.5}`, 400, "invalid_value"},
		{"value with a zero fraction", "u1", `{"usage_id":"a","meter":"api_calls","value":1.0}`, 400, "invalid_value"},
		{"value with an exponent", "u1", `{"usage_id":"a","meter":"api_calls","value":1e3}`, 400, "invalid_value"},
		{"value negative", "u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": -1}, 400, "invalid_value"},
		{"value beyond 2^53-1", "u1", `{"usage_id":"a","meter":"api_calls","value":9007199254740992}`, 400, "invalid_value"},
		{"value a boolean", "u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": true}, 400, "invalid_value"},
		{"timestamp not a time", "u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 1, "timestamp": "yesterday"}, 422, "invalid_timestamp"},
		{"timestamp a fraction", "u1", `{"usage_id":"a","meter":"api_calls","value":1,"timestamp":1.5}`, 422, "invalid_timestamp"},
		{"timestamp 36 days old", "u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 1,
			"timestamp": now.Add(-36 * 24 * time.Hour).Format(time.RFC3339)}, 422, "invalid_timestamp"},
		{"timestamp 6 minutes ahead (Unix seconds)", "u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 1,
			"timestamp": now.Add(6 * time.Minute).Unix()}, 422, "invalid_timestamp"},
		{"unknown field", "u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 1, "quantity": 2}, 400, "invalid_json"},
		{"not JSON", "u1", `{"usage_id":`, 400, "invalid_json"},
		{"bad user id", "u%20x", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 1}, 400, "invalid_user_id"},
		{"unknown user", "nobody", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 1}, 404, "customer_not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.post(tc.user, tc.body), tc.status, tc.code)
		})
	}
	var n int
	if err := v.db.Raw(`SELECT count(*) FROM usage_records`).Scan(&n).Error; err != nil || n != 0 {
		t.Errorf("%d records stored by refused requests (%v), want none", n, err)
	}
	// The edges are accepted: 35 days old less a minute, 5 minutes ahead, 0, 2^53-1.
	for i, body := range []map[string]any{
		{"meter": "api_calls", "value": 0, "timestamp": now.Add(-35*24*time.Hour + time.Minute).Format(time.RFC3339)},
		{"meter": "api.calls:v2-x_y", "value": MaxValue, "timestamp": now.Add(5 * time.Minute).Unix()},
	} {
		body["usage_id"] = "edge" + string(rune('a'+i))
		if rec := v.post("u1", body); rec.Code != http.StatusAccepted {
			t.Errorf("edge %v: %d %s, want 202", body, rec.Code, rec.Body)
		}
	}
}

type answerJSON struct {
	UsageID    string `json:"usage_id"`
	Meter      string `json:"meter"`
	Value      int64  `json:"value"`
	Timestamp  string `json:"timestamp"`
	Status     string `json:"status"`
	Identifier string `json:"identifier"`
}

func decodeAnswer(t *testing.T, body []byte) answerJSON {
	t.Helper()
	var a answerJSON
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	return a
}

// 202 once, 200 with the same record for the same body, 409 for the same usage_id with another
// meter, value or timestamp, and for another user's ids that spell the same identifier.
func TestPostIsIdempotent(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1", false)
	at := v.clock.Now().Add(-time.Hour)
	body := map[string]any{"usage_id": "call-1", "meter": "api_calls", "value": 3, "timestamp": at.Format(time.RFC3339)}
	first := v.post("u1", body)
	if first.Code != http.StatusAccepted {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	a := decodeAnswer(t, first.Body.Bytes())
	want := answerJSON{UsageID: "call-1", Meter: "api_calls", Value: 3, Timestamp: at.UTC().Format(time.RFC3339),
		Status: "pending", Identifier: "usage-u1-call-1"}
	if a != want {
		t.Fatalf("answer %+v, want %+v", a, want)
	}
	again := v.post("u1", body)
	if again.Code != http.StatusOK || again.Body.String() != first.Body.String() {
		t.Errorf("repeat: %d %s, want 200 %s", again.Code, again.Body, first.Body)
	}
	// A repeat that leaves the timestamp out is the same record; one in Unix seconds too.
	for _, ts := range []any{nil, at.Unix()} {
		b := map[string]any{"usage_id": "call-1", "meter": "api_calls", "value": 3}
		if ts != nil {
			b["timestamp"] = ts
		}
		if rec := v.post("u1", b); rec.Code != http.StatusOK || rec.Body.String() != first.Body.String() {
			t.Errorf("repeat with timestamp %v: %d %s", ts, rec.Code, rec.Body)
		}
	}
	for field, val := range map[string]any{"meter": "storage_gb", "value": 4, "timestamp": at.Add(time.Second).Format(time.RFC3339)} {
		b := map[string]any{"usage_id": "call-1", "meter": "api_calls", "value": 3}
		b[field] = val
		rec := v.post("u1", b)
		expectError(t, rec, http.StatusConflict, "idempotency_conflict")
		if !strings.Contains(rec.Body.String(), field) {
			t.Errorf("conflict on %s does not name it: %s", field, rec.Body)
		}
	}
	// A repeat long after is still answered from the record, though its timestamp is old now.
	v.clock.Add(40 * 24 * time.Hour)
	if rec := v.post("u1", body); rec.Code != http.StatusOK {
		t.Errorf("repeat 40 days later: %d %s, want 200", rec.Code, rec.Body)
	}
	v.clock.Add(-40 * 24 * time.Hour)

	// usage-u1-x-y: user u1's usage x-y, and user u1-x's usage y.
	v.addCustomer("u1-x", false)
	if rec := v.post("u1", map[string]any{"usage_id": "x-y", "meter": "api_calls", "value": 1}); rec.Code != http.StatusAccepted {
		t.Fatalf("u1 x-y: %d %s", rec.Code, rec.Body)
	}
	rec := v.post("u1-x", map[string]any{"usage_id": "y", "meter": "api_calls", "value": 1})
	expectError(t, rec, http.StatusConflict, "idempotency_conflict")
	if !strings.Contains(rec.Body.String(), "usage-u1-x-y") {
		t.Errorf("identifier conflict does not name it: %s", rec.Body)
	}
}

// The reporter sends each record as one meter event with its identifier (also its key) and
// marks it reported; a repeat of the POST then says so, and nothing is sent again.
func TestReporterSendsOnceAndMarks(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	cus := v.addCustomer("u1", false)
	at := v.clock.Now().Add(-time.Minute)
	body := map[string]any{"usage_id": "call-1", "meter": "api_calls", "value": 42, "timestamp": at.Unix()}
	if rec := v.post("u1", body); rec.Code != http.StatusAccepted {
		t.Fatalf("post: %d %s", rec.Code, rec.Body)
	}
	if n := v.report(); n != 1 {
		t.Fatalf("reporter took %d records, want 1", n)
	}
	reqs := v.proxy.Filter(http.MethodPost, meterPath)
	if len(reqs) != 1 {
		t.Fatalf("%d meter event requests, want 1", len(reqs))
	}
	for k, want := range map[string]string{
		"event_name": "api_calls", "identifier": "usage-u1-call-1", "payload[stripe_customer_id]": cus,
		"payload[value]": "42", "timestamp": strconv.FormatInt(at.Unix(), 10),
	} {
		if got := reqs[0].Form.Get(k); got != want {
			t.Errorf("meter event %s = %q, want %q", k, got, want)
		}
	}
	if reqs[0].IdempotencyKey != "usage-u1-call-1" {
		t.Errorf("idempotency key %q, want the identifier", reqs[0].IdempotencyKey)
	}
	r := v.row("u1", "call-1")
	if r.Status != stateReported || r.ReportedAt == nil || r.Attempts != 1 || r.FirstAttemptAt == nil {
		t.Errorf("row %+v, want reported after one attempt", r)
	}
	rec := v.post("u1", body)
	if rec.Code != http.StatusOK || decodeAnswer(t, rec.Body.Bytes()).Status != "reported" {
		t.Errorf("repeat after reporting: %d %s, want 200 reported", rec.Code, rec.Body)
	}
	if n := v.report(); n != 0 || len(v.proxy.Filter(http.MethodPost, meterPath)) != 1 {
		t.Errorf("a second round took %d records and sent %d requests in all, want 0 and 1", n, len(v.proxy.Filter(http.MethodPost, meterPath)))
	}
}

// A 429 leaves the record pending until Stripe's Retry-After has passed and pauses the
// reporter; a 5xx that outlasts stripe-go's retries backs off; both then report once.
func TestReporterBacksOff(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1", false)
	if rec := v.post("u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 1}); rec.Code != http.StatusAccepted {
		t.Fatalf("post: %d %s", rec.Code, rec.Body)
	}
	v.proxy.Throttle(http.MethodPost, meterPath, 1, 7*time.Second)
	v.report()
	r := v.row("u1", "a")
	if r.Status != statePending || r.Attempts != 1 || r.ErrorCode == nil || *r.ErrorCode != "rate_limit" ||
		!r.NextAttemptAt.Equal(v.clock.Now().Add(7*time.Second)) {
		t.Fatalf("after a 429: %+v, want pending, due in 7 s", r)
	}
	if p := v.svc.rep.paused(); p != 7*time.Second {
		t.Errorf("reporter paused for %v, want 7s", p)
	}
	if n := v.report(); n != 0 {
		t.Errorf("a round before Retry-After took %d records", n)
	}
	v.clock.Add(7 * time.Second)
	v.proxy.InjectFault(http.MethodPost, meterPath, stripeemu.Fault500, 3) // the try and stripe-go's 2 retries
	v.report()
	if r := v.row("u1", "a"); r.Status != statePending || r.Attempts != 2 || !r.NextAttemptAt.Equal(v.clock.Now().Add(2*time.Second)) {
		t.Fatalf("after a 500: %+v, want pending, due in 2 s (second attempt)", r)
	}
	v.clock.Add(2 * time.Second)
	v.report()
	if r := v.row("u1", "a"); r.Status != stateReported || v.meters.Count("usage-u1-a") != 1 || v.meters.Sends("usage-u1-a") != 1 {
		t.Errorf("row %+v, count %d sends %d; want reported, one event sent once", r, v.meters.Count("usage-u1-a"), v.meters.Sends("usage-u1-a"))
	}
}

// Stripe acted and the answer was lost (every try dropped after it executed): the next round
// sends the same identifier under the same key and gets Stripe's first answer back. With the key
// forgotten, Stripe's refusal of the known identifier marks the record reported too.
func TestLostAnswersAreResentUnderTheSameIdentifier(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1", false)
	for _, id := range []string{"a", "b"} {
		if rec := v.post("u1", map[string]any{"usage_id": id, "meter": "api_calls", "value": 2}); rec.Code != http.StatusAccepted {
			t.Fatalf("post %s: %d %s", id, rec.Code, rec.Body)
		}
	}
	v.proxy.InjectFault(http.MethodPost, meterPath, stripeemu.FaultDropAfter, 6)
	v.report()
	for _, id := range []string{"a", "b"} {
		if r := v.row("u1", id); r.Status != statePending || r.ErrorCode == nil || *r.ErrorCode != "no_answer" {
			t.Fatalf("%s after lost answers: %+v, want pending without an answer", id, r)
		}
		if v.meters.Count("usage-u1-"+id) != 1 {
			t.Fatalf("%s: Stripe holds no event", id)
		}
	}
	v.clock.Add(time.Second)
	v.proxy.ForgetKeys() // b's retry comes after Stripe's key window, inside its identifier window
	v.exec(`UPDATE usage_records SET next_attempt_at = now() + interval '1 hour' WHERE usage_id = 'b'`)
	v.report()
	v.exec(`UPDATE usage_records SET next_attempt_at = $1 WHERE usage_id = 'b'`, v.clock.Now())
	v.report()
	for _, id := range []string{"a", "b"} {
		r := v.row("u1", id)
		if r.Status != stateReported || v.meters.Count("usage-u1-"+id) != 1 {
			t.Errorf("%s: %+v with %d events at Stripe, want reported with 1", id, r, v.meters.Count("usage-u1-"+id))
		}
	}
	if got := v.meters.Totals()[[2]string{"cus_u1", "api_calls"}]; got != 4 {
		t.Errorf("Stripe's total %d, want 4", got)
	}
}

// The window is counted from the first attempt: a record never sent is sent however old it is;
// one whose first attempt is past usage.review_after and still unacknowledged is needs_review,
// never sent again, and still counted as pending.
func TestPastTheWindowNeedsReview(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1", false)
	for _, id := range []string{"old-unsent", "old-tried"} {
		if rec := v.post("u1", map[string]any{"usage_id": id, "meter": "api_calls", "value": 5}); rec.Code != http.StatusAccepted {
			t.Fatalf("post %s: %d %s", id, rec.Code, rec.Body)
		}
	}
	v.exec(`UPDATE usage_records SET next_attempt_at = $1 WHERE usage_id = 'old-unsent'`, v.clock.Now().Add(30*time.Hour))
	v.proxy.InjectFault(http.MethodPost, meterPath, stripeemu.FaultDrop, 3)
	v.report() // old-tried: tried, no answer
	v.clock.Add(DefaultReviewAfter)
	v.report()
	r := v.row("u1", "old-tried")
	if r.Status != stateNeedsReview || r.ReviewSince == nil || v.meters.Sends("usage-u1-old-tried") != 0 {
		t.Errorf("old-tried: %+v, sends %d; want needs_review, nothing more sent", r, v.meters.Sends("usage-u1-old-tried"))
	}
	sent := len(v.proxy.Filter(http.MethodPost, meterPath))
	v.clock.Add(10 * time.Hour)
	v.report()
	if r := v.row("u1", "old-unsent"); r.Status != stateReported {
		t.Errorf("old-unsent, 30 h old and never tried: %+v, want reported", r)
	}
	if n := len(v.proxy.Filter(http.MethodPost, meterPath)); n != sent+1 {
		t.Errorf("%d requests after the review, want %d (old-unsent's only)", n, sent+1)
	}
	rec := v.get("/v1/customers/u1/usage?meter=api_calls")
	if rec.Code != http.StatusOK {
		t.Fatalf("summary: %d %s", rec.Code, rec.Body)
	}
	if s := apitest.Decode(t, rec); s["total"] != float64(10) || s["pending"] != float64(5) {
		t.Errorf("summary %v, want total 10 with 5 pending (the one under review)", s)
	}

	// The operator sees it, and decides.
	list := v.admin(http.MethodGet, "/admin/usage/review", nil)
	var shown struct {
		Records []struct {
			UserID     string `json:"user_id"`
			UsageID    string `json:"usage_id"`
			Status     string `json:"status"`
			Identifier string `json:"identifier"`
		} `json:"records"`
	}
	if err := json.Unmarshal(list.Body.Bytes(), &shown); err != nil || list.Code != http.StatusOK || len(shown.Records) != 1 ||
		shown.Records[0].UsageID != "old-tried" || shown.Records[0].Status != stateNeedsReview {
		t.Fatalf("review list: %d %s", list.Code, list.Body)
	}
	if rec := apitest.Do(t, v.e, apitest.AppToken, http.MethodGet, "/admin/usage/review", nil); rec.Code != http.StatusUnauthorized && rec.Code != http.StatusForbidden {
		t.Errorf("the app token read the review list: %d", rec.Code)
	}
	expectError(t, v.admin(http.MethodPost, "/admin/usage/review/u1/old-tried", map[string]any{"decision": "maybe"}), http.StatusBadRequest, "invalid_request")
	expectError(t, v.admin(http.MethodPost, "/admin/usage/review/u1/old-unsent", map[string]any{"decision": "resend"}), http.StatusConflict, "conflict")
	expectError(t, v.admin(http.MethodPost, "/admin/usage/review/u1/none", map[string]any{"decision": "resend"}), http.StatusNotFound, "not_found")
	if rec := v.admin(http.MethodPost, "/admin/usage/review/u1/old-tried", map[string]any{"decision": "resend"}); rec.Code != http.StatusOK {
		t.Fatalf("resend: %d %s", rec.Code, rec.Body)
	}
	// Each decision is in the audit log, the refused one too.
	var audited []struct{ Target, Result string }
	if err := v.db.Raw(`SELECT target, result FROM admin_audit WHERE action = 'usage_review' ORDER BY id`).Scan(&audited).Error; err != nil {
		t.Fatal(err)
	}
	if len(audited) != 3 || audited[2].Target != "usage-u1-old-tried" || audited[2].Result != "resend" ||
		!strings.HasPrefix(audited[0].Result, "refused") {
		t.Errorf("audit log %+v, want the two refusals and the resend", audited)
	}
	v.report()
	if r := v.row("u1", "old-tried"); r.Status != stateReported || v.meters.Sends("usage-u1-old-tried") != 1 {
		t.Errorf("after the operator's resend: %+v, sends %d; want reported, sent once", r, v.meters.Sends("usage-u1-old-tried"))
	}
}

// An operator who finds the usage at Stripe marks it reported: it is never sent.
func TestOperatorMarksAReviewedRecordReported(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1", false)
	v.post("u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 5})
	v.proxy.InjectFault(http.MethodPost, meterPath, stripeemu.FaultDrop, 3)
	v.report()
	v.clock.Add(DefaultReviewAfter)
	v.report()
	if r := v.row("u1", "a"); r.Status != stateNeedsReview {
		t.Fatalf("row %+v, want needs_review", r)
	}
	if rec := v.admin(http.MethodPost, "/admin/usage/review/u1/a", map[string]any{"decision": "reported"}); rec.Code != http.StatusOK ||
		decodeAnswer(t, rec.Body.Bytes()).Status != stateReported {
		t.Fatalf("mark reported: %d %s", rec.Code, rec.Body)
	}
	v.clock.Add(time.Hour)
	v.report()
	if n := len(v.proxy.Filter(http.MethodPost, meterPath)); n != 3 {
		t.Errorf("%d meter event requests, want the 3 dropped tries only", n)
	}
	if s := apitest.Decode(t, v.get("/v1/customers/u1/usage?meter=api_calls")); s["total"] != float64(5) || s["pending"] != float64(0) {
		t.Errorf("summary %v, want 5 and 0", s)
	}
}

// A final refusal (not the known identifier) keeps the record as refused: not sent again, not
// in the totals.
func TestRefusedRecordIsKeptOutOfTheTotals(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1", false)
	v.post("u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 5})
	v.proxy.Respond(http.MethodPost, meterPath, 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusBadRequest, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "parameter_invalid", "message": "No such meter."}}}
	})
	v.report()
	v.clock.Add(time.Hour)
	v.report()
	r := v.row("u1", "a")
	if r.Status != stateRefused || r.ErrorCode == nil || *r.ErrorCode != "parameter_invalid" || len(v.proxy.Filter(http.MethodPost, meterPath)) != 1 {
		t.Errorf("row %+v after %d requests, want refused after 1", r, len(v.proxy.Filter(http.MethodPost, meterPath)))
	}
	if s := apitest.Decode(t, v.get("/v1/customers/u1/usage?meter=api_calls")); s["total"] != float64(0) || s["pending"] != float64(0) {
		t.Errorf("summary %v, want 0 and 0", s)
	}
}

// The summary sums the current period of the user's subscription, what is pending within it,
// and nothing of other meters, users or modes.
func TestSummaryOfTheCurrentPeriod(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	cus := v.addCustomer("u1", false)
	now := v.clock.Now()
	start, end := now.Add(-10*24*time.Hour), now.Add(20*24*time.Hour)
	v.exec(`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status, price_id,
		current_period_start, current_period_end, sub_event_created, status_since)
		VALUES ('sub_1', $1, false, 'active', 'price_1', $2, $3, $2, $2)`, cus, start, end)
	for id, rec := range map[string]struct {
		meter string
		value int
		at    time.Time
	}{
		"before":   {"api_calls", 100, start.Add(-time.Hour)},
		"in-1":     {"api_calls", 3, start.Add(time.Hour)},
		"in-2":     {"api_calls", 4, now.Add(-time.Minute)},
		"other":    {"storage_gb", 50, now.Add(-time.Minute)},
		"reported": {"api_calls", 10, now.Add(-2 * time.Hour)},
	} {
		if r := v.post("u1", map[string]any{"usage_id": id, "meter": rec.meter, "value": rec.value, "timestamp": rec.at.Unix()}); r.Code != http.StatusAccepted {
			t.Fatalf("post %s: %d %s", id, r.Code, r.Body)
		}
	}
	v.exec(`UPDATE usage_records SET status = 'reported' WHERE usage_id = 'reported'`)
	// The other mode's records of the same user are another world.
	v.exec(`INSERT INTO usage_records (livemode, user_id, usage_id, meter, value, occurred_at, stripe_customer_id, identifier,
		status, next_attempt_at, created_at, updated_at) VALUES (true, 'u1', 'live', 'api_calls', 1000, $1, 'cus_live', 'usage-u1-live',
		'pending', $1, $1, $1)`, now)
	rec := v.get("/v1/customers/u1/usage?meter=api_calls")
	if rec.Code != http.StatusOK {
		t.Fatalf("summary: %d %s", rec.Code, rec.Body)
	}
	var s summary
	if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	if s.UserID != "u1" || s.Meter != "api_calls" || s.PeriodStart == nil || !s.PeriodStart.Equal(start) ||
		s.PeriodEnd == nil || !s.PeriodEnd.Equal(end) || s.Total != 17 || s.Pending != 7 {
		t.Errorf("summary %s, want period %s–%s, total 17, pending 7", rec.Body, start, end)
	}
	expectError(t, v.get("/v1/customers/u1/usage"), http.StatusBadRequest, "invalid_meter")
	expectError(t, v.get("/v1/customers/u1/usage?meter=a/b"), http.StatusBadRequest, "invalid_meter")
	expectError(t, v.get("/v1/customers/nobody/usage?meter=api_calls"), http.StatusNotFound, "not_found")

	// The reporter of this mode never sends the other mode's record.
	v.report()
	if v.meters.Sends("usage-u1-live") != 0 {
		t.Error("the test-mode reporter sent a live-mode record")
	}
}

// The metrics count answers, reports and failures, and the gauge counts what drains.
func TestMetrics(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1", false)
	m := v.svc.metrics
	for _, id := range []string{"a", "b"} {
		v.post("u1", map[string]any{"usage_id": id, "meter": "api_calls", "value": 1})
	}
	v.post("u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 1})
	v.post("u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 2})
	v.svc.count(context.Background())
	if got := testutil.ToFloat64(m.records.WithLabelValues("pending")); got != 2 {
		t.Errorf("pending gauge %v, want 2", got)
	}
	v.proxy.Throttle(http.MethodPost, meterPath, 1, 0)
	v.report()
	v.clock.Add(time.Hour)
	v.report()
	v.svc.count(context.Background())
	for name, c := range map[string]struct {
		got  float64
		want float64
	}{
		"accepted":             {testutil.ToFloat64(m.requests.WithLabelValues("accepted")), 2},
		"repeat":               {testutil.ToFloat64(m.requests.WithLabelValues("repeat")), 1},
		"idempotency_conflict": {testutil.ToFloat64(m.requests.WithLabelValues("idempotency_conflict")), 1},
		"reported":             {testutil.ToFloat64(m.reported), 2},
		"rate_limited":         {testutil.ToFloat64(m.failures.WithLabelValues("rate_limited")), 1},
		"pending gauge":        {testutil.ToFloat64(m.records.WithLabelValues("pending")), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", name, c.got, c.want)
		}
	}
}

// The loop's wait: none due is no error (an idle reporter logs nothing), a backoff is its time.
func TestNextDue(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1", false)
	if _, ok := v.svc.nextDue(context.Background()); ok {
		t.Error("nextDue with no records: ok")
	}
	v.post("u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 1})
	v.exec(`UPDATE usage_records SET next_attempt_at = $1`, v.clock.Now().Add(time.Minute))
	if next, ok := v.svc.nextDue(context.Background()); !ok || !next.Equal(v.clock.Now().Add(time.Minute)) {
		t.Errorf("nextDue = %v %v, want in a minute", next, ok)
	}
}
