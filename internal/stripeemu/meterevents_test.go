package stripeemu

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

func postForm(t *testing.T, u, key string, form url.Values) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func meterForm(id string, value int64) url.Values {
	return url.Values{"event_name": {"api_calls"}, "identifier": {id}, "payload[stripe_customer_id]": {"cus_1"},
		"payload[value]": {strconv.FormatInt(value, 10)}, "timestamp": {strconv.FormatInt(time.Now().Unix(), 10)}}
}

// Meter events are kept by identifier: a repeat under the same key is the key layer's replay, a
// repeat under another key (or after the keys are forgotten) is refused as Stripe refuses it,
// and Sends counts what reached the events.
func TestMeterEventsDeduplicateByIdentifier(t *testing.T) {
	p := New(t, newTestServer(t, http.NotFoundHandler()))
	m := NewMeterEvents(p, false)
	u := p.URL + "/v1/billing/meter_events"

	if st, _, body := postForm(t, u, "usage-u1-1", meterForm("usage-u1-1", 5)); st != 200 || !strings.Contains(body, `"identifier":"usage-u1-1"`) {
		t.Fatalf("first event: %d %s", st, body)
	}
	if st, h, _ := postForm(t, u, "usage-u1-1", meterForm("usage-u1-1", 5)); st != 200 || h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("repeat under the key: %d replayed %q, want 200 replayed", st, h.Get("Idempotent-Replayed"))
	}
	p.ForgetKeys()
	if st, _, body := postForm(t, u, "usage-u1-1", meterForm("usage-u1-1", 5)); st != 400 || !strings.Contains(body, "already exists with identifier") {
		t.Errorf("repeat past the key window: %d %s, want 400 duplicate identifier", st, body)
	}
	if st, _, body := postForm(t, u, "", meterForm("usage-u1-2", 7)); st != 200 {
		t.Errorf("second event: %d %s", st, body)
	}
	form := meterForm("usage-u1-3", 1)
	form.Set("payload[value]", "1.5")
	if st, _, _ := postForm(t, u, "", form); st != 400 {
		t.Errorf("fractional value: %d, want 400", st)
	}
	form = meterForm("usage-u1-4", 1)
	form.Set("timestamp", strconv.FormatInt(time.Now().Add(-36*24*time.Hour).Unix(), 10))
	if st, _, _ := postForm(t, u, "", form); st != 400 {
		t.Errorf("timestamp 36 days old: %d, want 400", st)
	}
	if m.Count("usage-u1-1") != 1 || m.Sends("usage-u1-1") != 2 || m.Count("usage-u1-3") != 0 {
		t.Errorf("count %d sends %d of usage-u1-1, count %d of the refused one; want 1, 2, 0",
			m.Count("usage-u1-1"), m.Sends("usage-u1-1"), m.Count("usage-u1-3"))
	}
	if got := m.Totals()[[2]string{"cus_1", "api_calls"}]; got != 12 {
		t.Errorf("total %d, want 12", got)
	}
}

// A share of the requests fails with each injected fault, reproducibly; a 429 carries its
// Retry-After and stores nothing under the key.
func TestFaultShares(t *testing.T) {
	p := New(t, newTestServer(t, http.NotFoundHandler()))
	m := NewMeterEvents(p, false)
	p.Seed(7)
	p.InjectFaultShare(http.MethodPost, "/v1/billing/meter_events", Fault429, 0.2, 1500*time.Millisecond)
	p.InjectFaultShare(http.MethodPost, "/v1/billing/meter_events", Fault500, 0.2, 0)
	statuses := map[int]int{}
	for i := range 500 {
		id := "usage-u-" + strconv.Itoa(i)
		st, h, _ := postForm(t, p.URL+"/v1/billing/meter_events", id, meterForm(id, 1))
		statuses[st]++
		if st == 429 && h.Get("Retry-After") != "1.5" {
			t.Fatalf("429 with Retry-After %q, want 1.5", h.Get("Retry-After"))
		}
		if st == 429 || st == 500 {
			if st2, _, _ := postForm(t, p.URL+"/v1/billing/meter_events", id, meterForm(id, 1)); st2 == 200 && m.Sends(id) != 1 {
				t.Fatalf("retry after a %d: sends %d", st, m.Sends(id))
			}
		}
	}
	// 20% throttled, then 20% of the rest (16%) answered 500: wide bounds, the draws are seeded.
	if statuses[429] < 60 || statuses[429] > 140 || statuses[500] < 45 || statuses[500] > 120 || statuses[200] < 250 {
		t.Errorf("statuses %v, want about 100 429s, 80 500s and the rest 200", statuses)
	}
}
