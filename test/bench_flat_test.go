package test

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// BenchmarkFlatCost: the service's throughput must not depend on how much history the database
// holds. It measures the ingest (acknowledged events/s), the processing (events applied per
// second, from the first delivery until every accepted event is processed) and the entitlement
// reads (req/s) of two services, each on a cluster of its own: one with an empty database (the
// 10,000 users of the entitlement load only), the other with the same users and, seeded by SQL,
// BENCH_FLAT_EVENTS stored events (default 1,000,000) and BENCH_FLAT_SUBS subscriptions with
// their customers (default 100,000). The two are loaded in turn, in benchFlatRounds alternating
// rounds, and each ratio seeded/empty is the median of the rounds' ratios, against the target
// 0.9: the shared host's speed drifts by tens of percent from minute to minute, and alternating
// puts a drift on both sides of a ratio. Nothing is asserted about speed; the deliveries must all
// be accepted and processed.
//
//	go test -count=1 -run '^$' -bench FlatCost -benchtime 1x -timeout 60m ./test/
func BenchmarkFlatCost(b *testing.B) {
	events := benchCountEnv(b, "BENCH_FLAT_EVENTS", 1000000)
	subs := benchCountEnv(b, "BENCH_FLAT_SUBS", 100000)
	tmpl := benchEventTemplate(b)
	empty := &benchFlatSide{name: "empty", d: startBenchDB(b)}
	seeded := &benchFlatSide{name: "seeded", d: startBenchDB(b)}
	benchSeedUsers(b, empty.d)
	benchSeedUsers(b, seeded.d)

	t0 := time.Now()
	benchFlatSeed(b, seeded.d, events, subs)
	seedTime := time.Since(t0)
	t0 = time.Now()
	for _, side := range []*benchFlatSide{empty, seeded} {
		side.d.exec(b, `VACUUM ANALYZE`)
		// The seed and the vacuum leave gigabytes dirty: without a checkpoint now, the spread
		// checkpoints and the kernel's writeback of the next minutes compete with every commit's
		// fsync, and the seeded side measures the disk's backlog rather than the data's size.
		side.d.exec(b, `CHECKPOINT`)
	}
	vacuumTime := time.Since(t0)
	var stored int64
	if err := seeded.d.db.QueryRow(`SELECT count(*) FROM webhook_events`).Scan(&stored); err != nil {
		b.Fatal(err)
	}

	for _, side := range []*benchFlatSide{empty, seeded} {
		side.p = startBenchService(b, side.d, nil)
	}
	// Every round's two phases have ids of their own: phase (1-9) is part of every event and
	// subscription id, so that no phase delivers another's events.
	// PostgreSQL's own cost of the entitlement statement on each side (pgbench, the same rounds):
	// a b-tree of 110,000 keys has one more level than one of 10,000, which no service can save.
	var pgRatios []float64
	for round := range benchFlatRounds {
		empty.measure(b, tmpl, 2*round+1)
		seeded.measure(b, tmpl, 2*round+2)
		pgEmpty := empty.d.pgbench(b, benchEntitlementScript, benchClients, benchRoundDuration).tps
		pgSeeded := seeded.d.pgbench(b, benchEntitlementScript, benchClients, benchRoundDuration).tps
		pgRatios = append(pgRatios, pgSeeded/pgEmpty)
	}
	for _, side := range []*benchFlatSide{empty, seeded} {
		side.rss = benchPeakRSS(b, side.p.cmd.Process.Pid)
		if code := side.p.stop(b, syscall.SIGTERM); code != 0 {
			b.Errorf("%s: billing exited %d after SIGTERM", side.name, code)
		}
	}

	fmt.Printf("flat cost: %d events stored (%d seeded in %.0fs, VACUUM ANALYZE and CHECKPOINT %.0fs), %d subscriptions seeded [%d clients, %d rounds of %s per load, PostgreSQL %s]\n",
		stored, events, seedTime.Seconds(), vacuumTime.Seconds(), subs, benchClients, benchFlatRounds, benchRoundDuration, seeded.d.serverVersion(b))
	for _, m := range []struct {
		name, unit, metric string
		of                 func(benchFlatRound) float64
	}{
		{"ingest acknowledged", "events/s", "acked", func(r benchFlatRound) float64 { return r.acked }},
		{"applied", "events/s", "applied", func(r benchFlatRound) float64 { return r.applied }},
		{"entitlement", "req/s", "entitlement", func(r benchFlatRound) float64 { return r.entitlement }},
	} {
		var ratios []float64
		for i := range benchFlatRounds {
			ratios = append(ratios, m.of(seeded.rounds[i])/m.of(empty.rounds[i]))
		}
		ratio := benchMedian(ratios)
		fmt.Printf("flat cost: %-19s empty %s %s, seeded %s %s; ratio %.2f (%s; rounds %s)\n",
			m.name, empty.figures(m.of), m.unit, seeded.figures(m.of), m.unit, ratio, benchFlatVerdict(ratio), benchFigures(ratios, 2))
		b.ReportMetric(ratio, m.metric+"-ratio")
	}
	fmt.Printf("flat cost: pgbench of the entitlement statement, seeded / empty: %.2f (rounds %s): PostgreSQL's own share of the entitlement ratio\n",
		benchMedian(pgRatios), benchFigures(pgRatios, 2))
	fmt.Printf("flat cost: p99 acknowledgement empty %s, seeded %s; p99 entitlement empty %s, seeded %s (worst round); drained %.1fs after the last delivery empty, %.1fs seeded (worst round)\n",
		benchMS(empty.worst(func(r benchFlatRound) time.Duration { return r.ackP99 })), benchMS(seeded.worst(func(r benchFlatRound) time.Duration { return r.ackP99 })),
		benchMS(empty.worst(func(r benchFlatRound) time.Duration { return r.entP99 })), benchMS(seeded.worst(func(r benchFlatRound) time.Duration { return r.entP99 })),
		empty.worst(func(r benchFlatRound) time.Duration { return r.drain }).Seconds(), seeded.worst(func(r benchFlatRound) time.Duration { return r.drain }).Seconds())
	fmt.Printf("flat cost: peak RSS empty %.0f MB, seeded %.0f MB (%s)\n", empty.rss, seeded.rss, benchRSSVerdict(max(empty.rss, seeded.rss)))
	b.ReportMetric(max(empty.rss, seeded.rss), "peak-RSS-MB")
}

// benchFlatTarget is the least acceptable ratio seeded/empty.
const benchFlatTarget = 0.9

// benchFlatRounds is how many times each side is loaded; with benchFlatSide.measure's two phases
// a round, the phases' ids (1-9) allow at most 4.
const benchFlatRounds = 4

func benchFlatVerdict(ratio float64) string {
	if ratio >= benchFlatTarget {
		return fmt.Sprintf("target ≥ %.1f met", benchFlatTarget)
	}
	return fmt.Sprintf("BELOW TARGET %.1f", benchFlatTarget)
}

// benchFlatSide is one of the two services BenchmarkFlatCost compares, on its own cluster.
type benchFlatSide struct {
	name   string
	d      *benchDB
	p      *proc
	rounds []benchFlatRound
	rss    float64 // MB
}

type benchFlatRound struct {
	acked, applied, entitlement float64 // per second
	ackP99, entP99, drain       time.Duration
}

// measure posts distinct events to the side's service for benchRoundDuration, waits until every
// accepted one is processed, then runs the entitlement load for benchRoundDuration, and keeps
// the round's figures. phase (1-9) is part of every event and subscription id.
func (s *benchFlatSide) measure(b *testing.B, tmpl []byte, phase int) {
	b.Helper()
	var r benchFlatRound
	client := benchHTTPClient()
	url := s.p.url("/webhooks/stripe")
	begin := time.Now()
	lat, elapsed, errs, firstErr := benchLoad(benchClients, benchRoundDuration, func(w, i int) error {
		// The placeholders' width: phase, worker, sequence.
		suffix := fmt.Sprintf("%d%02d%09d", phase, w, i)
		body := bytes.ReplaceAll(tmpl, []byte(benchEvtPlaceholder), []byte("evt_bench_"+suffix))
		body = bytes.ReplaceAll(body, []byte(benchSubPlaceholder), []byte("sub_bench_"+suffix))
		return benchPostEvent(client, url, body)
	})
	sendEnd := time.Now()
	accepted := len(lat)
	if accepted == 0 {
		b.Fatalf("%s, phase %d: no event accepted (%d errors, first: %v)", s.name, phase, errs, firstErr)
	}
	if errs > 0 {
		b.Errorf("%s, phase %d: %d deliveries not accepted; first: %v", s.name, phase, errs, firstErr)
	}
	// The seed stores no received event, and the earlier phases were drained: every received one
	// is this phase's.
	benchWaitDrained(b, s.d, sendEnd, 5*time.Minute)
	done := time.Now()
	var processed, other int
	prefix := fmt.Sprintf("evt_bench_%d%%", phase)
	if err := s.d.db.QueryRow(`SELECT count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status <> 'processed')
		FROM webhook_events WHERE event_id LIKE $1`, prefix).Scan(&processed, &other); err != nil {
		b.Fatal(err)
	}
	if processed != accepted || other != 0 {
		b.Errorf("%s, phase %d: accepted %d events; processed %d, other statuses %d", s.name, phase, accepted, processed, other)
	}
	r.acked = float64(accepted) / elapsed.Seconds()
	r.applied = float64(accepted) / done.Sub(begin).Seconds()
	r.ackP99 = benchQuantile(lat, 0.99)
	r.drain = done.Sub(sendEnd)

	entLat, entElapsed, entErrs, entErr := benchEntitlementLoad(s.p.url(""), benchRoundDuration)
	if len(entLat) == 0 {
		b.Fatalf("%s, phase %d: no entitlement answered (%d errors, first: %v)", s.name, phase, entErrs, entErr)
	}
	if entErrs > 0 {
		b.Errorf("%s, phase %d: %d entitlement requests failed; first: %v", s.name, phase, entErrs, entErr)
	}
	r.entitlement = float64(len(entLat)) / entElapsed.Seconds()
	r.entP99 = benchQuantile(entLat, 0.99)
	s.rounds = append(s.rounds, r)
}

// figures lists one figure of every round.
func (s *benchFlatSide) figures(of func(benchFlatRound) float64) string {
	v := make([]float64, len(s.rounds))
	for i, r := range s.rounds {
		v[i] = of(r)
	}
	return benchFigures(v, 0)
}

// worst is the largest of one duration over the rounds.
func (s *benchFlatSide) worst(of func(benchFlatRound) time.Duration) time.Duration {
	var w time.Duration
	for _, r := range s.rounds {
		w = max(w, of(r))
	}
	return w
}

// benchFlatSeed stores a history: subs customers with a subscription each (2% past_due on hold,
// some canceled or trialing), and events stored events spread over the 89 days before the last
// ten minutes (inside the retention, beyond the sweeper's age): 90% processed, 10% ignored (types
// not handled), 0.2% failed with a dead letter, none waiting. Payloads are real events' envelopes
// and objects naming the seeded subscriptions and customers (ten events each), padded to about
// 2.8 KB with random hex and repetitive text, so that they compress and are TOASTed as real
// ones are. The last day's processed events keep their completed River job, as River's cleaner
// leaves them.
func benchFlatSeed(b *testing.B, d *benchDB, events, subs int) {
	b.Helper()
	d.exec(b, `INSERT INTO customers (user_id, stripe_customer_id, email, name, livemode, created_at, updated_at)
		SELECT 'user_seed_' || g, 'cus_seed_' || g, 'seed' || g || '@example.com', 'Seed ' || g, false,
			now() - interval '400 days', now() - interval '1 day'
		FROM generate_series(1, $1::int) g`, subs)
	d.exec(b, `INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status, price_id,
			current_period_start, current_period_end, cancel_at_period_end, canceled_at, ended_at, status_since,
			sub_event_id, sub_event_type, sub_event_created, sub_event_rank,
			payment_hold, payment_hold_since, latest_invoice_id, attempt_count, amount_due, currency,
			inv_event_id, inv_event_type, inv_event_created, inv_event_rank, created_at, updated_at)
		SELECT 'sub_seed_' || g, 'cus_seed_' || g, false, st, 'price_seed',
			now() - interval '10 days', now() + interval '20 days', false,
			CASE WHEN st = 'canceled' THEN now() - interval '30 days' END, CASE WHEN st = 'canceled' THEN now() - interval '30 days' END,
			now() - interval '10 days', 'evt_seedsub_' || g, 'customer.subscription.updated', now() - interval '10 days', 10,
			st = 'past_due', CASE WHEN st = 'past_due' THEN now() - interval '2 days' END, 'in_seed_' || g, 1, 2000, 'usd',
			'evt_seedinv_' || g, 'invoice.payment_succeeded', now() - interval '10 days', 2, now() - interval '300 days', now() - interval '10 days'
		FROM (SELECT g, CASE WHEN g % 50 = 0 THEN 'past_due' WHEN g % 7 = 0 THEN 'canceled' WHEN g % 11 = 0 THEN 'trialing' ELSE 'active' END AS st
		      FROM generate_series(1, $1::int) g) s`, subs)
	d.exec(b, `WITH pad AS MATERIALIZED (
			SELECT i, string_agg(md5(random()::text), '') AS hex FROM generate_series(0, 999) i, generate_series(1, 50) k GROUP BY i
		)
		INSERT INTO webhook_events (event_id, source, type, livemode, api_version, status, payload, attempts,
			received_at, processed_at, failure_reason, event_created)
		SELECT e.id, 'stripe', e.type, false, '2024-06-20', e.status,
			jsonb_build_object('id', e.id, 'object', 'event', 'api_version', '2024-06-20', 'created', extract(epoch FROM e.received_at)::bigint - 1,
				'livemode', false, 'pending_webhooks', 1, 'request', jsonb_build_object('id', NULL, 'idempotency_key', NULL), 'type', e.type,
				'data', jsonb_build_object('object', CASE
				WHEN e.type LIKE 'customer.subscription.%' THEN jsonb_build_object('id', e.sub, 'object', 'subscription', 'customer', e.cus,
					'status', 'active', 'description', repeat('Pro plan, monthly. ', 40), 'metadata', jsonb_build_object('padding', p.hex))
				WHEN e.type LIKE 'invoice.%' THEN jsonb_build_object('id', 'in_seed_' || e.g, 'object', 'invoice', 'subscription', e.sub,
					'customer', e.cus, 'status', 'paid', 'amount_due', 2000, 'currency', 'usd', 'description', repeat('Pro plan, monthly. ', 40),
					'metadata', jsonb_build_object('padding', p.hex))
				WHEN e.type = 'customer.updated' THEN jsonb_build_object('id', e.cus, 'object', 'customer', 'email', 'x@example.com',
					'description', repeat('Customer since 2024. ', 35), 'metadata', jsonb_build_object('padding', p.hex))
				ELSE jsonb_build_object('id', 'pm_seed_' || e.g, 'object', 'payment_method', 'customer', e.cus,
					'description', repeat('Card ending 4242. ', 40), 'metadata', jsonb_build_object('padding', p.hex))
				END)),
			CASE WHEN e.status = 'failed' THEN 3 WHEN e.status = 'processed' THEN 1 ELSE 0 END,
			e.received_at, CASE WHEN e.status = 'processed' THEN e.received_at + interval '40 milliseconds' END,
			CASE WHEN e.status = 'failed' THEN 'handler_error: seeded failure' END, e.received_at - interval '1 second'
		FROM (
			SELECT g, 'evt_1' || substr(md5('evt' || g), 1, 23) AS id,
				'sub_seed_' || (1 + g % $2::int) AS sub, 'cus_seed_' || (1 + g % $2::int) AS cus,
				now() - interval '10 minutes' - ($1::int - g) * (interval '89 days' / $1::int) AS received_at,
				CASE WHEN g % 20 < 8 THEN 'customer.subscription.updated' WHEN g % 20 < 12 THEN 'invoice.payment_succeeded'
				     WHEN g % 20 < 14 THEN 'invoice.paid' WHEN g % 20 < 15 THEN 'customer.subscription.created'
				     WHEN g % 20 < 16 THEN 'invoice.payment_failed' WHEN g % 20 < 18 THEN 'customer.updated'
				     ELSE 'payment_method.attached' END AS type,
				CASE WHEN g % 20 >= 18 THEN 'ignored' WHEN g % 500 = 1 THEN 'failed' ELSE 'processed' END AS status
			FROM generate_series(1, $1::int) g) e
		JOIN pad p ON p.i = e.g % 1000`, events, subs)
	d.exec(b, `INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error, dead_at)
		SELECT event_id, livemode, 3, 'handler_error: seeded failure', received_at + interval '5 minutes'
		FROM webhook_events WHERE status = 'failed' AND event_id LIKE 'evt_1%'`)
	d.exec(b, `INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, scheduled_at, attempted_at, finalized_at, attempt, created_at)
		SELECT jsonb_build_object('event_id', event_id), 'webhook_event', 25, 1, 'webhooks', 'completed', received_at, received_at,
			processed_at, 1, received_at
		FROM webhook_events WHERE status = 'processed' AND event_id LIKE 'evt_1%' AND received_at > now() - interval '1 day'`)
}
