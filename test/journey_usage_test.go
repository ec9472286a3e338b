package test

import (
	"encoding/json"
	"net/http"
	"time"

	"billing/internal/stripeemu"
)

// usage is the journey's metered use: the app records two uses in the current period (one of
// them twice), the reporter gets each to Stripe as one meter event, and the summary sums the
// period with nothing pending.
func (j *journey) usage(step string, periodStart, periodEnd time.Time) {
	j.t.Helper()
	meters := stripeemu.NewMeterEvents(j.proxy, false)
	at := periodStart.Add(time.Second).Unix()
	uses := []map[string]any{
		{"usage_id": "journey-use-1", "meter": "api_calls", "value": 12, "timestamp": at},
		{"usage_id": "journey-use-2", "meter": "api_calls", "value": 30, "timestamp": at},
	}
	var first string
	for i, u := range uses {
		a := j.call(http.MethodPost, "/v1/customers/"+jnyUser+"/usage", u)
		if a.status != http.StatusAccepted {
			j.t.Fatalf("%s: POST usage %v: %d %s, want 202", step, u, a.status, a.body)
		}
		if i == 0 {
			first = string(a.body)
		}
	}
	if a := j.call(http.MethodPost, "/v1/customers/"+jnyUser+"/usage", uses[0]); a.status != http.StatusOK {
		j.t.Fatalf("%s: the same usage again: %d %s, want 200", step, a.status, a.body)
	} else {
		var got, want map[string]any
		_ = json.Unmarshal(a.body, &got)
		_ = json.Unmarshal([]byte(first), &want)
		got["status"], want["status"] = nil, nil
		if g, _ := json.Marshal(got); string(g) != mustJSON(want) {
			j.t.Errorf("%s: the repeat answered %s, want the record of %s", step, a.body, first)
		}
	}
	var last string
	if !waitUntil(jnyWait, func() bool {
		a := j.call(http.MethodGet, "/v1/customers/"+jnyUser+"/usage?meter=api_calls", nil)
		last = string(a.body)
		var s struct {
			PeriodStart time.Time `json:"period_start"`
			PeriodEnd   time.Time `json:"period_end"`
			Total       int64     `json:"total"`
			Pending     int64     `json:"pending"`
		}
		_ = json.Unmarshal(a.body, &s)
		return a.status == http.StatusOK && s.Total == 42 && s.Pending == 0 &&
			s.PeriodStart.Equal(periodStart) && s.PeriodEnd.Equal(periodEnd)
	}) {
		j.t.Fatalf("%s: usage summary %s, want 42 in the period %s–%s, none pending", step, last, periodStart, periodEnd)
	}
	for _, id := range []string{"usage-" + jnyUser + "-journey-use-1", "usage-" + jnyUser + "-journey-use-2"} {
		if meters.Count(id) != 1 || meters.Sends(id) != 1 {
			j.t.Errorf("%s: meter event %s held %d times, sent %d times; want once", step, id, meters.Count(id), meters.Sends(id))
		}
	}
	if got := meters.Totals()[[2]string{j.customer, "api_calls"}]; got != 42 {
		j.t.Errorf("%s: Stripe's total for the customer %d, want 42", step, got)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
