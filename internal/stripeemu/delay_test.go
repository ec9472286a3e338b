package stripeemu

import (
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A delayed request holds its idempotency key while "Stripe" works on it: a repeat under the key
// is answered 409 before the delayed one is answered, and the upstream executes it once.
func TestDelayHoldsTheKeyInFlight(t *testing.T) {
	var executed atomic.Int32
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executed.Add(1)
		writeJSON(w, http.StatusOK, map[string]any{"id": "pi_1", "object": "payment_intent"})
	})
	p := New(t, newTestServer(t, upstream))
	p.Delay(http.MethodPost, "/v1/payment_intents", 2*time.Second, -1)

	post := func() int {
		req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/payment_intents", strings.NewReader(url.Values{"amount": {"100"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", "charge-order_1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	answers := make(chan int, 2)
	go func() { answers <- post() }()
	go func() { answers <- post() }()
	first, second := <-answers, <-answers
	if first != http.StatusConflict || second != http.StatusOK {
		t.Errorf("answers in order %d, %d; want 409 (key in flight) before 200 (the delayed one)", first, second)
	}
	if n := executed.Load(); n != 1 {
		t.Errorf("upstream executed %d requests, want 1", n)
	}
}
