package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/testenv"
)

// The sizes the issue asks for.
const (
	usageRecords = 1000
	usageRepeats = 200 // 20 %
	usageClients = 8
	usageKills   = 5
	usageUsers   = 20
)

type usageRec struct {
	idx     int
	user    string
	id      string
	meter   string
	value   int64
	ts      *int64 // nil: left out of the body
	body    []byte
	answers []usageReply // every 2xx it got, in order
	mu      sync.Mutex
}

type usageReply struct {
	status int
	body   usageAnswer
}

type usageAnswer struct {
	UsageID    string `json:"usage_id"`
	Meter      string `json:"meter"`
	Value      int64  `json:"value"`
	Timestamp  string `json:"timestamp"`
	Status     string `json:"status"`
	Identifier string `json:"identifier"`
}

// Usage counts exactly once, end to end: 1,000 records posted by 8 concurrent clients, a fifth
// of them posted again, while the service is SIGKILLed 5 times and Stripe (the double) answers
// 429 or 500 to a share of the meter event calls and drops a share of answers after acting. Then:
// one meter event per record reached Stripe, each sent once past the key layer (the service
// never leaned on the identifier's limited deduplication), every repeat answered 200 with the
// first answer's record, nothing lost, and the local totals equal Stripe's.
func TestUsageReportedExactlyOnce(t *testing.T) {
	t.Parallel()
	seed := relSeed(t)
	rng := rand.New(rand.NewPCG(seed, 23))
	url := testenv.DatabaseURL(t)
	db := openDB(t, url)
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	meters := stripeemu.NewMeterEvents(proxy, false)
	proxy.Seed(seed)
	const path = "/v1/billing/meter_events"
	proxy.InjectFaultShare(http.MethodPost, path, stripeemu.Fault429, 0.08, 200*time.Millisecond)
	proxy.InjectFaultShare(http.MethodPost, path, stripeemu.Fault500, 0.08, 0)
	proxy.InjectFaultShare(http.MethodPost, path, stripeemu.FaultDropAfter, 0.05, 0)
	// Stripe takes a moment to answer, so that a kill finds the reporter inside its calls.
	proxy.Delay(http.MethodPost, path, 20*time.Millisecond, -1)

	users := make([]string, usageUsers)
	for i := range users {
		users[i] = fmt.Sprintf("user_usage_%02d", i)
		if _, err := db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ($1, $2, $3)`,
			users[i], "cus_"+users[i], users[i]+"@example.com"); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	recs := make([]*usageRec, usageRecords)
	for i := range recs {
		r := &usageRec{idx: i, user: users[rng.IntN(len(users))], id: fmt.Sprintf("rec-%04d", i),
			meter: []string{"api_calls", "storage_gb"}[rng.IntN(2)], value: int64(rng.IntN(100))}
		body := map[string]any{"usage_id": r.id, "meter": r.meter, "value": r.value}
		if rng.IntN(4) > 0 {
			ts := now.Add(-time.Duration(rng.IntN(72*60)) * time.Minute).Unix()
			r.ts = &ts
			body["timestamp"] = ts
		}
		r.body, _ = json.Marshal(body)
		recs[i] = r
	}
	// Every record once and a fifth of them again, in one shuffled stream.
	var sends []*usageRec
	sends = append(sends, recs...)
	for range usageRepeats {
		sends = append(sends, recs[rng.IntN(len(recs))])
	}
	rng.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })

	env := relEnv(t, url)
	env["BILLING_STRIPE_API_URL"] = proxy.URL
	env["BILLING_USAGE_REPORT_RATE"] = "200"
	svc := newService(t, "billing", env)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	work := make(chan *usageRec)
	var answered, retried atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 15 * time.Second}
	for range usageClients {
		wg.Go(func() {
			for r := range work {
				// A client retries until it has an answer: through the kills, connections are
				// refused or cut, and the restart may answer 503 until it is ready.
				deadline := time.Now().Add(2 * time.Minute)
				for {
					status, body, err := postUsage(ctx, client, svc.url("/v1/customers/"+r.user+"/usage"), r.body)
					if err == nil && (status == http.StatusAccepted || status == http.StatusOK) {
						var a usageAnswer
						if jerr := json.Unmarshal(body, &a); jerr != nil {
							t.Errorf("%s: answer %s: %v", r.id, body, jerr)
						}
						r.mu.Lock()
						r.answers = append(r.answers, usageReply{status: status, body: a})
						r.mu.Unlock()
						answered.Add(1)
						break
					}
					if err == nil && status < 500 {
						t.Errorf("%s: %d %s", r.id, status, body)
						break
					}
					if time.Now().After(deadline) || ctx.Err() != nil {
						t.Errorf("%s: no answer within 2 minutes (last %d %v)", r.id, status, err)
						break
					}
					retried.Add(1)
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, r := range sends {
			select {
			case work <- r:
			case <-ctx.Done():
			}
		}
		close(work)
		wg.Wait()
	}()

	// The kills: each when a random share (5–85 %) of the requests has been answered, plus a
	// random few milliseconds, while requests are in flight and the reporter is mid-call.
	thresholds := make([]int64, usageKills)
	for i := range thresholds {
		thresholds[i] = int64(len(sends) * (5 + rng.IntN(81)) / 100)
	}
	slices.Sort(thresholds)
	t0 := time.Now()
	for _, th := range thresholds {
		if !waitUntil(3*time.Minute, func() bool { return answered.Load() >= th }) {
			t.Fatalf("only %d of %d requests answered", answered.Load(), len(sends))
		}
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		svc.kill()
		svc.start()
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("clients still running after 5 minutes: %d answered", answered.Load())
	}

	// The reporter drains: no record left pending.
	var pending int
	if !waitUntil(3*time.Minute, func() bool {
		return db.QueryRow(`SELECT count(*) FROM usage_records WHERE status <> 'reported'`).Scan(&pending) == nil && pending == 0
	}) {
		t.Fatalf("%d usage records still not reported after 3 minutes", pending)
	}
	elapsed := time.Since(t0)

	// Nothing lost, nothing twice: a row per record, reported; one event per identifier at
	// Stripe, each sent once past the key layer; no event Stripe holds that is not a record's.
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM usage_records WHERE status = 'reported'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != usageRecords {
		t.Errorf("%d reported rows, want %d", rows, usageRecords)
	}
	wantTotals := map[[2]string]int64{}
	var accepted, repeats, resent int
	for _, r := range recs {
		identifier := "usage-" + r.user + "-" + r.id
		wantTotals[[2]string{"cus_" + r.user, r.meter}] += r.value
		if n := meters.Count(identifier); n != 1 {
			t.Errorf("%s: %d meter events at Stripe, want 1", identifier, n)
		}
		if n := meters.Sends(identifier); n != 1 {
			resent++
			if resent <= 10 {
				t.Errorf("%s: sent %d times past the key layer, want 1", identifier, n)
			}
		}
		if len(r.answers) == 0 {
			t.Errorf("%s: never answered", r.id)
			continue
		}
		// The first answer is the one that stored the record (202), when the client got it: the
		// clients' goroutines may record a concurrent repeat's 200 before it.
		firstAt, stored := 0, 0
		for i, a := range r.answers {
			if a.status == http.StatusAccepted {
				firstAt, stored = i, stored+1
			}
		}
		accepted += stored
		if stored > 1 {
			t.Errorf("%s: answered 202 %d times, want once at most", r.id, stored)
		}
		first := r.answers[firstAt]
		if first.body.UsageID != r.id || first.body.Meter != r.meter || first.body.Value != r.value || first.body.Identifier != identifier {
			t.Errorf("%s: first answer %+v does not match the record", r.id, first.body)
		}
		if r.ts != nil && first.body.Timestamp != time.Unix(*r.ts, 0).UTC().Format(time.RFC3339) {
			t.Errorf("%s: timestamp %s, want %s", r.id, first.body.Timestamp, time.Unix(*r.ts, 0).UTC().Format(time.RFC3339))
		}
		for i, a := range r.answers {
			if i == firstAt {
				continue
			}
			repeats++
			same := a.body
			same.Status = first.body.Status
			// A repeat is the first answer's record; its status says where it is now.
			if a.status != http.StatusOK || same != first.body || (a.body.Status != "pending" && a.body.Status != "reported") {
				t.Errorf("%s: repeat answered %d %+v, want 200 with the first answer %+v", r.id, a.status, a.body, first.body)
			}
		}
	}
	if accepted > usageRecords {
		t.Errorf("%d answers 202, want at most one per record (%d)", accepted, usageRecords)
	}
	if n := len(meters.Events()); n != usageRecords {
		t.Errorf("Stripe holds %d meter events, want %d", n, usageRecords)
	}
	if got := meters.Totals(); !mapsEqual(got, wantTotals) {
		t.Errorf("Stripe's totals %v, want %v", got, wantTotals)
	}
	// The local totals (no subscription: every record of the meter) equal Stripe's.
	for _, u := range users {
		for _, m := range []string{"api_calls", "storage_gb"} {
			code, body := get(t, svc.url("/v1/customers/"+u+"/usage?meter="+m), relAPIToken)
			var s struct {
				Total   int64 `json:"total"`
				Pending int64 `json:"pending"`
			}
			if code != http.StatusOK || json.Unmarshal([]byte(body), &s) != nil {
				t.Errorf("usage of %s %s: %d %s", u, m, code, body)
				continue
			}
			if want := meters.Totals()[[2]string{"cus_" + u, m}]; s.Total != want || s.Pending != 0 {
				t.Errorf("usage of %s %s: total %d pending %d, Stripe's total %d", u, m, s.Total, s.Pending, want)
			}
		}
	}
	// The faults happened. A replay whose key's previous request was answered (not dropped) is a
	// resend after a kill between Stripe's answer and the mark.
	faults := map[string]int{}
	answeredBefore := map[string]bool{}
	for _, r := range proxy.Filter(http.MethodPost, path) {
		if r.Replayed && answeredBefore[r.IdempotencyKey] {
			faults["resent after a kill"]++
		}
		if r.Status == http.StatusOK && r.Fault != stripeemu.FaultDropAfter {
			answeredBefore[r.IdempotencyKey] = true
		}
		switch {
		case r.Status == http.StatusTooManyRequests:
			faults["429"]++
		case r.Status == http.StatusInternalServerError:
			faults["500"]++
		case r.Fault == stripeemu.FaultDropAfter:
			faults["dropped after"]++
		case r.Replayed:
			faults["replayed"]++
		}
	}
	for _, k := range []string{"429", "500", "dropped after"} {
		if faults[k] == 0 {
			t.Errorf("no %s among the meter event calls: the test did not exercise it", k)
		}
	}
	if svc.kills != usageKills {
		t.Errorf("%d kills, want %d", svc.kills, usageKills)
	}
	line := fmt.Sprintf("usage: records=%d requests=%d repeats_answered=%d kills=%d meter_calls=%d faults=%v resent_past_key_layer=%d client_retries=%d elapsed=%s",
		usageRecords, len(sends), repeats, svc.kills, len(proxy.Filter(http.MethodPost, path)), faults, resent, retried.Load(), elapsed.Round(time.Millisecond))
	t.Log(line)
	fmt.Println(line)
}

func postUsage(ctx context.Context, client *http.Client, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+relAPIToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func mapsEqual(a, b map[[2]string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
