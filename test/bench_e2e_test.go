package test

// End-to-end benchmarks of the real binary, on the helpers of bench_test.go: a realistic mix of
// webhook events from receipt to applied state (BenchmarkEndToEnd), and whether a slow Stripe
// under charge load hurts webhook receipt and entitlement reads (BenchmarkIsolation). They
// measure whatever the service does (queued or applied at receipt) and report; a figure under
// its target is printed, not failed. BENCH_E2E_DURATION shortens the send windows.

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

const (
	e2eDuration     = 60 * time.Second
	e2eIsoPhase     = 20 * time.Second
	e2eIsoSenders   = 16
	e2eIsoReaders   = 16
	e2eIsoCharges   = 64
	e2eStripeDelay  = 30 * time.Second
	e2eDrainLimit   = 5 * time.Minute
	e2eCusHolder    = "cus_bench_000000000000"
	e2eInvHolder    = "in_bench_000000000000"
	e2eTargetLagP99 = time.Second
	e2eTargetRatio  = 2.0 // isolation: p99 under charge load / p99 without
)

// e2eCreatedHolder is the events' "created" in the templates, replaced per event by the send
// time: the ordering guard compares it, so events must carry their real moment.
var e2eCreatedHolder = time.Unix(1000000000, 0)

// benchDurationEnv is the duration in the environment variable name (1s or more), else def.
func benchDurationEnv(b *testing.B, name string, def time.Duration) time.Duration {
	b.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second {
		b.Fatalf("%s=%q: want a duration of 1s or more", name, s)
	}
	return d
}

// benchCountEnv is the whole number (1 or more) in the environment variable name, else def.
func benchCountEnv(b *testing.B, name string, def int) int {
	b.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a whole number from 1", name, s)
	}
	return n
}

// e2eMix is the share of each event type in the traffic, in percent (a month of a SaaS account:
// mostly renewals and their payments, some sign-ups, failures and cancellations).
var e2eMix = []struct {
	typ   string
	share int
}{
	{"customer.subscription.updated", 35},
	{"invoice.payment_succeeded", 25},
	{"customer.subscription.created", 15},
	{"invoice.payment_failed", 10},
	{"customer.subscription.deleted", 5},
	{"invoice.payment_action_required", 5},
	{"customer.updated", 5},
}

// e2eEvents makes distinct signed-to-be events of the mix over the seeded population (users 1..n,
// with customer cus_bench_i and subscription sub_bench_i): templates of about benchEventBytes made
// once, whose ids and "created" are replaced per event.
type e2eEvents struct {
	tmpl  map[string][]byte
	users int
	// Subscriptions created by the run, per sender: its deletions cancel those first, so that
	// cancellations do not eat into the seeded population the updates apply to.
	mu      sync.Mutex
	created map[int][][2]string
}

func newE2EEvents(b *testing.B, users int) *e2eEvents {
	b.Helper()
	now := time.Now()
	sub := stripeevents.Subscription{ID: benchSubPlaceholder, Customer: e2eCusHolder, Status: "active", PriceID: "price_bench",
		CurrentPeriodStart: now, CurrentPeriodEnd: now.AddDate(0, 1, 0)}
	inv := stripeevents.Invoice{ID: e2eInvHolder, Customer: e2eCusHolder, Subscription: benchSubPlaceholder, Currency: "usd",
		AmountDue: 2000, CustomerEmail: "customer@example.com", HostedInvoiceURL: "https://invoice.stripe.com/i/acct_bench/" + e2eInvHolder}
	g := &e2eEvents{tmpl: map[string][]byte{}, users: users, created: map[int][][2]string{}}
	for _, m := range e2eMix {
		var raw []byte
		switch m.typ {
		case "customer.subscription.updated":
			raw = stripeevents.SubscriptionEvent(benchEvtPlaceholder, m.typ, e2eCreatedHolder, false, sub)
		case "customer.subscription.created":
			s := sub
			s.Status, s.TrialStart, s.TrialEnd = "trialing", now, now.AddDate(0, 0, 14)
			raw = stripeevents.SubscriptionEvent(benchEvtPlaceholder, m.typ, e2eCreatedHolder, false, s)
		case "customer.subscription.deleted":
			s := sub
			s.Status, s.CanceledAt, s.EndedAt = "canceled", now, now
			raw = stripeevents.SubscriptionEvent(benchEvtPlaceholder, m.typ, e2eCreatedHolder, false, s)
		case "invoice.payment_succeeded":
			i := inv
			i.Status, i.AttemptCount, i.AmountPaid = "paid", 1, i.AmountDue
			raw = stripeevents.InvoiceEvent(benchEvtPlaceholder, m.typ, e2eCreatedHolder, false, i)
		case "invoice.payment_failed", "invoice.payment_action_required":
			i := inv
			i.Status, i.AttemptCount, i.NextPaymentAttempt = "open", 1, now.AddDate(0, 0, 3)
			raw = stripeevents.InvoiceEvent(benchEvtPlaceholder, m.typ, e2eCreatedHolder, false, i)
		case "customer.updated":
			raw = stripeevents.Event(benchEvtPlaceholder, m.typ, e2eCreatedHolder, false,
				map[string]any{"id": e2eCusHolder, "object": "customer", "email": "renamed@example.com", "name": "Renamed"}, nil)
		default:
			b.Fatalf("no template for %s", m.typ)
		}
		g.tmpl[m.typ] = e2ePad(b, raw)
	}
	return g
}

// e2ePad pads an event as BenchmarkIngest's (benchPad) and checks its placeholders.
func e2ePad(b *testing.B, raw []byte) []byte {
	b.Helper()
	out := benchPad(b, raw)
	if bytes.Count(out, []byte(benchEvtPlaceholder)) != 1 || bytes.Count(out, []byte(`"created":1000000000`)) != 1 {
		b.Fatalf("event template: the event id and created must appear once:\n%s", out)
	}
	return out
}

// pick draws a type of the mix.
func (g *e2eEvents) pick() string {
	r := rand.IntN(100)
	for _, m := range e2eMix {
		if r < m.share {
			return m.typ
		}
		r -= m.share
	}
	return e2eMix[0].typ
}

// next is sender w's i-th event: its type, id and body.
func (g *e2eEvents) next(w, i int) (typ, id string, body []byte) {
	typ = g.pick()
	suffix := fmt.Sprintf("%02d%012d", w, i)
	id = "evt_e2e_" + suffix
	u := strconv.Itoa(1 + rand.IntN(g.users))
	sub, cus := "sub_bench_"+u, "cus_bench_"+u
	switch typ {
	case "customer.subscription.created":
		sub = "sub_new_" + suffix
		g.mu.Lock()
		g.created[w] = append(g.created[w], [2]string{sub, cus})
		g.mu.Unlock()
	case "customer.subscription.deleted":
		g.mu.Lock()
		if own := g.created[w]; len(own) > 0 {
			sub, cus = own[len(own)-1][0], own[len(own)-1][1]
			g.created[w] = own[:len(own)-1]
		}
		g.mu.Unlock()
	}
	body = bytes.Replace(g.tmpl[typ], []byte(benchEvtPlaceholder), []byte(id), 1)
	body = bytes.ReplaceAll(body, []byte(benchSubPlaceholder), []byte(sub))
	body = bytes.ReplaceAll(body, []byte(e2eCusHolder), []byte(cus))
	body = bytes.ReplaceAll(body, []byte(e2eInvHolder), []byte("in_e2e_"+suffix))
	body = bytes.Replace(body, []byte(`"created":1000000000`), []byte(`"created":`+strconv.FormatInt(time.Now().Unix(), 10)), 1)
	return typ, id, body
}

// benchE2EBaselineScript is the per-event work the design needs, as a pgbench script: the
// service's store-and-enqueue statement (benchIngestStatementScript), then the apply transaction
// of a customer.subscription.updated: the event locked by its key, the subscription made to
// exist and locked (lockSubscription), the customer's mode checked, the guarded UPDATE of the
// snapshot, the event marked processed.
func benchE2EBaselineScript(b *testing.B, d *benchDB, users int) string {
	b.Helper()
	const evt = `'evt_pgbench_' || :client_id || '_' || :n`
	return benchIngestStatementScript(b, d, benchEventTemplate(b)) + `\set g random(1, ` + strconv.Itoa(users) + `)
BEGIN;
SELECT event_id, type, livemode, api_version, status, payload, attempts, received_at, event_created
  FROM webhook_events WHERE event_id = ` + evt + ` FOR UPDATE;
WITH inserted AS (
  INSERT INTO subscriptions AS s (subscription_id, stripe_customer_id, livemode, status, created_at, updated_at)
  VALUES ('sub_bench_' || :g, 'cus_bench_' || :g, false, 'incomplete', now(), now())
  ON CONFLICT (subscription_id, livemode) DO NOTHING
  RETURNING s.*
), existing AS (
  SELECT s.* FROM subscriptions s WHERE s.subscription_id = 'sub_bench_' || :g FOR UPDATE
)
SELECT * FROM inserted UNION ALL SELECT * FROM existing;
SELECT EXISTS (SELECT 1 FROM customers WHERE stripe_customer_id = 'cus_bench_' || :g AND livemode <> false);
UPDATE subscriptions SET
  stripe_customer_id = 'cus_bench_' || :g,
  status_since = CASE WHEN sub_event_created IS NULL OR status IS DISTINCT FROM 'active' THEN now() ELSE status_since END,
  status = 'active', price_id = 'price_bench', current_period_start = now(), current_period_end = now() + interval '1 month',
  cancel_at_period_end = false, cancel_at = NULL, canceled_at = NULL, ended_at = NULL, trial_start = NULL, trial_end = NULL,
  sub_event_id = ` + evt + `, sub_event_type = 'customer.subscription.updated', sub_event_created = now(), sub_event_rank = 31,
  updated_at = now()
WHERE subscription_id = 'sub_bench_' || :g AND livemode = false
  AND (sub_event_created IS NULL OR (sub_event_created, sub_event_rank, sub_event_id COLLATE "C") < (now(), 31, (` + evt + `) COLLATE "C"))
  AND status NOT IN ('canceled', 'incomplete_expired');
UPDATE webhook_events SET status = 'processed', processed_at = now(), attempts = 1, failure_reason = NULL
  WHERE event_id = ` + evt + `;
COMMIT;
`
}

func e2eVerdict(ok bool, target string) string {
	if ok {
		return "target " + target + " met"
	}
	return "MISSED TARGET " + target
}

// e2eSampler counts the backlog (events stored and not yet applied) once a second until stopped.
type e2eSampler struct {
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	series []int
	err    error
}

func startE2ESampler(d *benchDB) *e2eSampler {
	s := &e2eSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			var n int
			err := d.db.QueryRow(`SELECT count(*) FROM webhook_events WHERE status = 'received'`).Scan(&n)
			s.mu.Lock()
			if err != nil && s.err == nil {
				s.err = err
			}
			s.series = append(s.series, n)
			s.mu.Unlock()
		}
	}()
	return s
}

// finish stops the sampler and returns the series.
func (s *e2eSampler) finish() ([]int, error) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.series), s.err
}

func e2eJoin(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, " ")
}

// BenchmarkEndToEnd: 32 senders post distinct signed ~3 KB events of seven handled types in the
// proportions of e2eMix over 10,000 seeded customers and subscriptions for 60 s
// (BENCH_E2E_DURATION). A sampler counts the backlog every second. Reported: acknowledged/s,
// applied/s (from the first delivery to the last event applied, after the backlog drains), the
// backlog series, the lag from acknowledgement to applied (p50, p99: each sender's 200 to the
// event's processed_at; the stored received_at → processed_at beside it), the service's peak
// RSS, and pgbench running the per-event work of the design on the same cluster, before and after.
func BenchmarkEndToEnd(b *testing.B) {
	dur := benchDurationEnv(b, "BENCH_E2E_DURATION", e2eDuration)
	pgDur := max(time.Second, min(benchDuration, dur))
	d := startBenchDB(b)
	benchSeedUsers(b, d)
	gen := newE2EEvents(b, benchUsers)
	script := benchE2EBaselineScript(b, d, benchUsers)

	var ceiling benchCeiling
	ceiling.before = d.pgbench(b, script, benchClients, pgDur)
	d.exec(b, `TRUNCATE webhook_events, river_job CASCADE`)
	d.exec(b, `CHECKPOINT`)

	p := startBenchService(b, d, nil)
	client := benchHTTPClient()
	url := p.url("/webhooks/stripe")
	// Each sender keeps its own acknowledgements (no lock on the hot path): the lag is measured
	// from the moment the sender got its 200.
	type ack struct {
		typ string
		at  time.Time
	}
	acks := make([]map[string]ack, benchClients)
	for w := range acks {
		acks[w] = map[string]ack{}
	}
	sampler := startE2ESampler(d)
	lat, elapsed, errs, firstErr := benchLoad(benchClients, dur, func(w, i int) error {
		typ, id, body := gen.next(w, i)
		if err := benchPostEvent(client, url, body); err != nil {
			return err
		}
		acks[w][id] = ack{typ, time.Now()}
		return nil
	})
	sendEnd := time.Now()
	var finalBacklog int
	if err := d.db.QueryRow(`SELECT count(*) FROM webhook_events WHERE status = 'received'`).Scan(&finalBacklog); err != nil {
		b.Fatal(err)
	}
	sampler.mu.Lock()
	sendSamples := len(sampler.series)
	sampler.mu.Unlock()
	acked := len(lat)
	if acked == 0 {
		b.Fatalf("no event acknowledged (%d errors, first: %v)", errs, firstErr)
	}
	if errs > 0 {
		b.Errorf("%d deliveries not acknowledged; first: %v", errs, firstErr)
	}

	// Drained: nothing stored is waiting to be applied any more.
	benchWaitDrained(b, d, sendEnd, e2eDrainLimit)
	drained := time.Since(sendEnd)
	series, serr := sampler.finish()
	if serr != nil {
		b.Fatalf("backlog sampler: %v", serr)
	}
	var processed, failed int
	var window, lagP50, lagP99 float64
	if err := d.db.QueryRow(`SELECT count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status = 'failed'),
			coalesce(extract(epoch FROM max(processed_at) - min(received_at)), 0),
			coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - received_at)), 0),
			coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - received_at)), 0)
		FROM webhook_events`).Scan(&processed, &failed, &window, &lagP50, &lagP99); err != nil {
		b.Fatal(err)
	}
	if processed != acked || failed != 0 {
		b.Errorf("acknowledged %d events; processed %d, failed %d", acked, processed, failed)
	}
	sent := map[string]int{}
	ackedByID := map[string]ack{}
	for _, own := range acks {
		for id, a := range own {
			ackedByID[id] = a
			sent[a.typ]++
		}
	}
	// Applied at or before its 200 (in the receive transaction) is a lag of 0: the event was
	// applied when the sender learned it was received.
	var ackLag []time.Duration
	rows, err := d.db.Query(`SELECT event_id, processed_at FROM webhook_events WHERE status = 'processed'`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			b.Fatal(err)
		}
		if a, ok := ackedByID[id]; ok {
			ackLag = append(ackLag, max(0, at.Sub(a.at)))
		}
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	rows.Close()
	slices.Sort(ackLag)
	if len(ackLag) != acked {
		b.Errorf("%d acknowledged events, %d of them found processed", acked, len(ackLag))
	}
	ackLag50, ackLag99 := benchQuantile(ackLag, 0.5), benchQuantile(ackLag, 0.99)
	rss := benchPeakRSS(b, p.cmd.Process.Pid)
	if code := p.stop(b, syscall.SIGTERM); code != 0 {
		b.Errorf("billing exited %d after SIGTERM", code)
	}
	d.exec(b, `TRUNCATE webhook_events, river_job CASCADE`)
	d.exec(b, `CHECKPOINT`)
	ceiling.after = d.pgbench(b, script, benchClients, pgDur)

	ackRate := float64(acked) / elapsed.Seconds()
	appliedRate := float64(processed) / max(window, 1e-3)
	maxBacklog := slices.Max(append([]int{finalBacklog}, series...))
	ratio := appliedRate / ceiling.tps()
	lag50, lag99 := time.Duration(lagP50*float64(time.Second)), time.Duration(lagP99*float64(time.Second))
	var mix []string
	for _, m := range e2eMix {
		mix = append(mix, fmt.Sprintf("%s %d", m.typ, sent[m.typ]))
	}
	fmt.Printf("end-to-end: %d events acknowledged in %.1fs [%s], %d senders, %d users, PostgreSQL %s\n",
		acked, elapsed.Seconds(), strings.Join(mix, ", "), benchClients, benchUsers, d.serverVersion(b))
	fmt.Printf("end-to-end: acknowledged %.0f/s (p50 %s, p99 %s); applied %.0f/s over %.1fs from the first receipt to the last applied (drained %.1fs after the last delivery)\n",
		ackRate, benchMS(benchQuantile(lat, 0.5)), benchMS(benchQuantile(lat, 0.99)), appliedRate, window, drained.Seconds())
	fmt.Printf("end-to-end: backlog each second while sending: %s | while draining: %s | max %d, at the end of sending %d\n",
		e2eJoin(series[:min(sendSamples, len(series))]), e2eJoin(series[min(sendSamples, len(series)):]), maxBacklog, finalBacklog)
	fmt.Printf("end-to-end: lag acknowledgement → applied (the sender's 200 → processed_at; 0 if applied before the 200) p50 %s p99 %s; stored lag (received_at → processed_at) p50 %s p99 %s; peak RSS %.0f MB; %s\n",
		benchMS(ackLag50), benchMS(ackLag99), benchMS(lag50), benchMS(lag99), rss, ceiling)
	fmt.Printf("end-to-end verdicts: applied/acknowledged %.2f (%s); final backlog %.1f s of traffic (%s); lag p99 %s (%s); applied/pgbench %.2f (%s)\n",
		appliedRate/ackRate, e2eVerdict(appliedRate >= 0.9*ackRate, "≥ 0.9"),
		float64(finalBacklog)/ackRate, e2eVerdict(float64(finalBacklog) < 2*ackRate, "< 2 s"),
		benchMS(ackLag99), e2eVerdict(ackLag99 < e2eTargetLagP99, "< 1 s"),
		ratio, benchVerdict(ratio))
	b.ReportMetric(ackRate, "acked/s")
	b.ReportMetric(appliedRate, "applied/s")
	b.ReportMetric(float64(maxBacklog), "backlog-max")
	b.ReportMetric(float64(finalBacklog), "backlog-final")
	b.ReportMetric(float64(ackLag50)/float64(time.Millisecond), "lag-p50-ms")
	b.ReportMetric(float64(ackLag99)/float64(time.Millisecond), "lag-p99-ms")
	b.ReportMetric(lagP99*1000, "stored-lag-p99-ms")
	b.ReportMetric(ceiling.tps(), "pgbench-tps")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(rss, "peak-RSS-MB")
}

// e2eIsoResult is one measurement window of the isolation benchmark.
type e2eIsoResult struct {
	receipt, reads          []time.Duration
	receiptErrs, readErrs   int
	receiptFirst, readFirst error
}

// e2eIsoLoad runs webhook receipt (e2eIsoSenders) and entitlement reads (e2eIsoReaders) at once
// for dur.
func e2eIsoLoad(base string, gen *e2eEvents, users int, dur time.Duration, phase int) e2eIsoResult {
	var r e2eIsoResult
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		client := benchHTTPClient()
		r.receipt, _, r.receiptErrs, r.receiptFirst = benchLoad(e2eIsoSenders, dur, func(w, i int) error {
			// Phases use their own event ids: a repeat would be answered duplicate.
			_, _, body := gen.next(phase*e2eIsoSenders+w, i)
			return benchPostEvent(client, base+"/webhooks/stripe", body)
		})
	}()
	go func() {
		defer wg.Done()
		client := benchHTTPClient()
		r.reads, _, r.readErrs, r.readFirst = benchLoad(e2eIsoReaders, dur, func(w, i int) error {
			return benchGetEntitlement(client, base, users)
		})
	}()
	wg.Wait()
	return r
}

type e2eCharge struct {
	order  string
	status int
	code   string
	retry  string // Retry-After
	err    error
}

// BenchmarkIsolation: webhook receipt (16 senders of the e2eMix events) and entitlement reads (16
// clients) for 20 s, then the same for 20 s while 64 POST /v1/charges arrive at once and Stripe
// answers every PaymentIntent create after 30 s (the emulator of internal/stripeemu in front of stripe-mock).
// Reported: the p99 of receipt and reads during the charges over their p99 before (target ≤ 2),
// their failures (target 0), how many charges were answered 503 busy with Retry-After and how many
// were let through; and that no busy order left a ledger row.
func BenchmarkIsolation(b *testing.B) {
	phase := min(e2eIsoPhase, benchDurationEnv(b, "BENCH_E2E_DURATION", e2eIsoPhase))
	d := startBenchDB(b)
	benchSeedUsers(b, d)
	gen := newE2EEvents(b, benchUsers)
	stripe := stripeemu.New(b, testenv.StripeMockURL(b))
	p := startBenchService(b, d, map[string]string{
		"BILLING_STRIPE_API_URL":    stripe.URL,
		"BILLING_STRIPE_SECRET_KEY": "sk_test_bench",
	})
	base := p.url("")

	quiet := e2eIsoLoad(base, gen, benchUsers, phase, 0)

	stripe.Delay(http.MethodPost, "/v1/payment_intents", e2eStripeDelay, -1)
	charges := make([]e2eCharge, e2eIsoCharges)
	var chargesDone sync.WaitGroup
	var answered atomic.Int32
	chargeClient := &http.Client{Timeout: 5 * time.Minute}
	for i := range charges {
		chargesDone.Add(1)
		go func() {
			defer chargesDone.Done()
			defer answered.Add(1)
			c := &charges[i]
			c.order = fmt.Sprintf("iso_%03d", i)
			body := fmt.Sprintf(`{"order_id":%q,"user_id":"user_%d","amount":1250,"currency":"eur"}`, c.order, i+1)
			req, err := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(body))
			if err != nil {
				c.err = err
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+benchAPIToken)
			resp, err := chargeClient.Do(req)
			if err != nil {
				c.err = err
				return
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			c.status, c.retry, c.code = resp.StatusCode, resp.Header.Get("Retry-After"), apiErrorCode(answer)
		}()
	}
	loaded := e2eIsoLoad(base, gen, benchUsers, phase, 1)
	answeredDuring := answered.Load()

	// Every charge answered: those let through wait for the slow Stripe (and stripe-go's retries).
	waitDone := make(chan struct{})
	go func() { chargesDone.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(5 * time.Minute):
		b.Fatal("charges still unanswered 5 minutes after they were sent")
	}
	var busy, busyNoRetryAfter, transportErrs int
	var busyOrders []string
	through := map[string]int{}
	for _, c := range charges {
		switch {
		case c.err != nil:
			transportErrs++
			b.Errorf("charge %s: %v", c.order, c.err)
		case c.status == http.StatusServiceUnavailable && c.code == "busy":
			busy++
			busyOrders = append(busyOrders, c.order)
			if c.retry == "" {
				busyNoRetryAfter++
			}
		default:
			through[fmt.Sprintf("%d %s", c.status, c.code)]++
		}
	}
	if busyNoRetryAfter > 0 {
		b.Errorf("%d busy answers without Retry-After", busyNoRetryAfter)
	}
	// Nothing half-written: a busy answer comes before the handler, so its order has no row.
	var busyRows int
	if err := d.db.QueryRow(`SELECT count(*) FROM charges WHERE order_id = ANY($1)`, busyOrders).Scan(&busyRows); err != nil {
		b.Fatal(err)
	}
	if busyRows != 0 {
		b.Errorf("%d ledger rows for orders answered 503 busy", busyRows)
	}
	var rowStates []string
	rows, err := d.db.Query(`SELECT state || coalesce('/' || status, '') || coalesce(' ' || error_code, ''), count(*)
		FROM charges GROUP BY 1 ORDER BY 1`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			b.Fatal(err)
		}
		rowStates = append(rowStates, fmt.Sprintf("%s: %d", s, n))
	}
	rows.Close()
	// The creates let through end at the double after its delay, whatever their callers gave up
	// on: then each order let through must have made exactly one PaymentIntent, its retries
	// under the same key refused while it was in flight.
	throughCount := len(charges) - busy - transportErrs
	piDeadline := time.Now().Add(2 * e2eStripeDelay)
	for stripe.Executed(http.MethodPost, "/v1/payment_intents") < throughCount && time.Now().Before(piDeadline) {
		time.Sleep(100 * time.Millisecond)
	}
	piMade := stripe.Executed(http.MethodPost, "/v1/payment_intents")
	piRefused := 0
	for _, r := range stripe.Filter(http.MethodPost, "/v1/payment_intents") {
		if r.Status == http.StatusConflict {
			piRefused++
		}
	}
	if piMade != throughCount {
		b.Errorf("%d PaymentIntents made for %d charges let through", piMade, throughCount)
	}
	rss := benchPeakRSS(b, p.cmd.Process.Pid)
	if code := p.stop(b, syscall.SIGTERM); code != 0 {
		b.Errorf("billing exited %d after SIGTERM", code)
	}

	for name, r := range map[string]e2eIsoResult{"without charges": quiet, "with charges": loaded} {
		if r.receiptErrs > 0 {
			b.Errorf("receipt %s: %d failures; first: %v", name, r.receiptErrs, r.receiptFirst)
		}
		if r.readErrs > 0 {
			b.Errorf("reads %s: %d failures; first: %v", name, r.readErrs, r.readFirst)
		}
		if len(r.receipt) == 0 || len(r.reads) == 0 {
			b.Fatalf("%s: no receipt (%d) or no read (%d) succeeded", name, len(r.receipt), len(r.reads))
		}
	}
	recBefore, recDuring := benchQuantile(quiet.receipt, 0.99), benchQuantile(loaded.receipt, 0.99)
	readBefore, readDuring := benchQuantile(quiet.reads, 0.99), benchQuantile(loaded.reads, 0.99)
	recRatio := float64(recDuring) / float64(recBefore)
	readRatio := float64(readDuring) / float64(readBefore)
	var thr []string
	for k, n := range through {
		thr = append(thr, fmt.Sprintf("%s: %d", k, n))
	}
	slices.Sort(thr)
	fmt.Printf("isolation: %s windows, %d senders and %d readers; %d charges at once, Stripe answering PaymentIntent creates after %s, stripe.max_concurrent_calls at its default [PostgreSQL %s]\n",
		phase, e2eIsoSenders, e2eIsoReaders, e2eIsoCharges, e2eStripeDelay, d.serverVersion(b))
	fmt.Printf("isolation: receipt p99 %s → %s, ratio %.2f (%s); %d then %d receipts, failures %d then %d (%s)\n",
		benchMS(recBefore), benchMS(recDuring), recRatio, e2eVerdict(recRatio <= e2eTargetRatio, "≤ 2"),
		len(quiet.receipt), len(loaded.receipt), quiet.receiptErrs, loaded.receiptErrs,
		e2eVerdict(quiet.receiptErrs+loaded.receiptErrs == 0, "0"))
	fmt.Printf("isolation: reads p99 %s → %s, ratio %.2f (%s); %d then %d reads, failures %d then %d (%s)\n",
		benchMS(readBefore), benchMS(readDuring), readRatio, e2eVerdict(readRatio <= e2eTargetRatio, "≤ 2"),
		len(quiet.reads), len(loaded.reads), quiet.readErrs, loaded.readErrs,
		e2eVerdict(quiet.readErrs+loaded.readErrs == 0, "0"))
	fmt.Printf("isolation: charges: %d answered 503 busy with Retry-After (%d of them without), %d let through [%s], %d transport errors; %d answered within the window; %d PaymentIntents made at Stripe, %d retries refused (key in flight); ledger rows of busy orders: %d; ledger rows [%s]; peak RSS %.0f MB\n",
		busy-busyNoRetryAfter, busyNoRetryAfter, throughCount, strings.Join(thr, ", "), transportErrs,
		answeredDuring, piMade, piRefused, busyRows, strings.Join(rowStates, ", "), rss)
	b.ReportMetric(float64(recBefore)/float64(time.Millisecond), "receipt-p99-before-ms")
	b.ReportMetric(float64(recDuring)/float64(time.Millisecond), "receipt-p99-during-ms")
	b.ReportMetric(recRatio, "receipt-p99-ratio")
	b.ReportMetric(float64(readBefore)/float64(time.Millisecond), "reads-p99-before-ms")
	b.ReportMetric(float64(readDuring)/float64(time.Millisecond), "reads-p99-during-ms")
	b.ReportMetric(readRatio, "reads-p99-ratio")
	b.ReportMetric(float64(quiet.receiptErrs+loaded.receiptErrs), "receipt-failures")
	b.ReportMetric(float64(quiet.readErrs+loaded.readErrs), "read-failures")
	b.ReportMetric(float64(busy), "charges-busy")
	b.ReportMetric(float64(throughCount), "charges-through")
}
