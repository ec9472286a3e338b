package test

// Benchmarks of the real binary against PostgreSQL's own ceiling, measured in the same run on the
// same durable cluster (fsync on, as in production). `make bench`:
//
//	go test -count=1 -run '^$' -bench . -benchtime 1x -timeout 30m ./test/
//
// Each benchmark starts its own cluster, runs pgbench with a script doing the same SQL as the
// service's path, then the service itself, and prints one summary line with the ratio. Results
// are recorded in docs/benchmarks.md. A ratio under the target is reported, not failed.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"billing/internal/pgcluster"
	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

const (
	benchSecret     = "whsec_bench_0123456789abcdef0123456789abcdef"
	benchAPIToken   = "app-bench-0123456789abcdef0123456789"
	benchClients    = 32
	benchDuration   = 10 * time.Second
	benchUsers      = 10000
	benchEventBytes = 3 * 1024
	benchTargetRate = 0.5 // service rate / pgbench rate
	benchTargetRSS  = 100 // MB

	benchEventType = "customer.subscription.updated"
	// Placeholders of the event template, replaced per event (same width as the real ids).
	benchEvtPlaceholder = "evt_bench_000000000000"
	benchSubPlaceholder = "sub_bench_000000000000"
)

// benchDB is a durable PostgreSQL cluster started for one benchmark, with a database "billing".
type benchDB struct {
	cluster *pgcluster.Cluster
	url     string
	db      *sql.DB
	dir     string // cluster root; also the service's working directory
}

func startBenchDB(b *testing.B) *benchDB {
	b.Helper()
	dir, err := os.MkdirTemp("", "billing-bench-")
	if err != nil {
		b.Fatal(err)
	}
	// The postgres user (the server runs as postgres when we are root) must reach the directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: filepath.Join(dir, "pg"), RemoveOnExit: true})
	if err != nil {
		os.RemoveAll(dir)
		b.Fatalf("start PostgreSQL: %v", err)
	}
	b.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(sctx); err != nil {
			b.Errorf("stop PostgreSQL: %v", err)
		}
		os.RemoveAll(dir)
	})
	admin, err := sql.Open("pgx", c.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE billing"); err != nil {
		b.Fatal(err)
	}
	d := &benchDB{cluster: c, url: c.URL("billing"), dir: dir}
	if d.db, err = sql.Open("pgx", d.url); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.db.Close() })
	// The schema, by the binary itself.
	if code, out := runCmd(b, dir, map[string]string{"BILLING_DATABASE_URL": d.url}, "migrate"); code != 0 {
		b.Fatalf("billing migrate: exit %d\n%s", code, out)
	}
	return d
}

func (d *benchDB) exec(b *testing.B, query string, args ...any) {
	b.Helper()
	if _, err := d.db.Exec(query, args...); err != nil {
		b.Fatalf("%.80s: %v", query, err)
	}
}

// serverVersion is the server's version string, e.g. "15.18 (Debian 15.18-0+deb12u1)".
func (d *benchDB) serverVersion(b *testing.B) string {
	var v string
	if err := d.db.QueryRow(`SHOW server_version`).Scan(&v); err != nil {
		b.Fatal(err)
	}
	return v
}

type benchPgbenchResult struct {
	tps     float64
	latency time.Duration // average
}

// benchCeiling is pgbench measured right before and right after the service's run: this
// machine's speed drifts by tens of percent over minutes (shared host), and the mean of the two
// bracketing runs keeps that drift out of the ratio; both are printed.
type benchCeiling struct{ before, after benchPgbenchResult }

func (c benchCeiling) tps() float64 { return (c.before.tps + c.after.tps) / 2 }

func (c benchCeiling) latency() time.Duration { return (c.before.latency + c.after.latency) / 2 }

func (c benchCeiling) String() string {
	return fmt.Sprintf("pgbench %.0f tps = mean of %.0f before and %.0f after", c.tps(), c.before.tps, c.after.tps)
}

var (
	benchPgbenchTPS     = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	benchPgbenchLatency = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
	benchPgbenchFailed  = regexp.MustCompile(`number of failed transactions: ([0-9]+)`)
)

// pgbench runs script for dur with clients connections (prepared statements, as pgx caches
// them) against the benchmark database.
func (d *benchDB) pgbench(b *testing.B, script string, clients int, dur time.Duration) benchPgbenchResult {
	b.Helper()
	bin := filepath.Join(d.cluster.BinDir(), "pgbench")
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("pgbench"); err != nil {
			b.Fatal("pgbench not found (install postgresql-contrib or the server package)")
		}
	}
	file := filepath.Join(b.TempDir(), "script.sql")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())),
		"-T", strconv.Itoa(int(dur/time.Second)), "-f", file,
		"-h", "127.0.0.1", "-p", strconv.Itoa(d.cluster.Port()), "-U", "postgres", "billing")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("pgbench: %v\n%s", err, out)
	}
	tps := benchPgbenchTPS.FindSubmatch(out)
	lat := benchPgbenchLatency.FindSubmatch(out)
	if tps == nil || lat == nil {
		b.Fatalf("pgbench output not understood:\n%s", out)
	}
	if f := benchPgbenchFailed.FindSubmatch(out); f != nil && string(f[1]) != "0" {
		b.Fatalf("pgbench: %s failed transactions:\n%s", f[1], out)
	}
	var r benchPgbenchResult
	r.tps, _ = strconv.ParseFloat(string(tps[1]), 64)
	ms, _ := strconv.ParseFloat(string(lat[1]), 64)
	r.latency = time.Duration(ms * float64(time.Millisecond))
	return r
}

// startBenchService runs `billing serve` on the benchmark database with extra settings if any,
// logging at info as in production. BENCH_LOG_LEVEL, if set, is its log.level and
// BENCH_WORKER_CONCURRENCY its worker.concurrency, BENCH_GROUP_COMMIT its webhooks.group_commit (to
// compare sizes; 1 turns it off). BENCH_PROFILE, if set, is a
// directory: the service then serves its profiler, for benchProfile.
func startBenchService(b *testing.B, d *benchDB, extra map[string]string) *proc {
	b.Helper()
	debug := ""
	if os.Getenv(benchProfileEnv) != "" {
		debug = freeAddr(b)
		extra = maps.Clone(extra)
		if extra == nil {
			extra = map[string]string{}
		}
		extra["BILLING_HTTP_DEBUG_ADDR"] = debug
	}
	env := map[string]string{
		"BILLING_DATABASE_URL":                d.url,
		"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": benchSecret,
		"BILLING_AUTH_API_TOKENS":             benchAPIToken,
		"BILLING_LOG_LEVEL":                   "info",
	}
	if l := os.Getenv("BENCH_LOG_LEVEL"); l != "" {
		env["BILLING_LOG_LEVEL"] = l
	}
	if n := os.Getenv("BENCH_WORKER_CONCURRENCY"); n != "" {
		env["BILLING_WORKER_CONCURRENCY"] = n
	}
	if n := os.Getenv("BENCH_GROUP_COMMIT"); n != "" {
		env["BILLING_WEBHOOKS_GROUP_COMMIT"] = n
	}
	for k, v := range extra {
		env[k] = v
	}
	p := start(b, d.dir, env)
	p.debugAddr = debug
	return p
}

const benchProfileEnv = "BENCH_PROFILE"

// benchProfile records a CPU profile of p for dur into $BENCH_PROFILE/name.pprof in the
// background (read it with go tool pprof), when BENCH_PROFILE is set; the returned wait blocks
// until it is written.
func benchProfile(b *testing.B, p *proc, name string, dur time.Duration) (wait func()) {
	dir := os.Getenv(benchProfileEnv)
	if dir == "" || p.debugAddr == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.debugAddr, int(dur.Seconds()))
		resp, err := http.Get(url)
		if err != nil {
			b.Errorf("profile %s: %v", name, err)
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s", resp.Status, data)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name+".pprof"), data, 0o644)
		}
		if err != nil {
			b.Errorf("profile %s: %v", name, err)
			return
		}
		fmt.Printf("profile of %s: %s\n", name, filepath.Join(dir, name+".pprof"))
	}()
	return func() { <-done }
}

// benchPostEvent delivers one event signed with the bench secret; nil when acknowledged 200 received.
func benchPostEvent(client *http.Client, url string, body []byte) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", stripeevents.SignatureHeader(body, benchSecret, time.Now()))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(answer, []byte(`"received"`)) {
		return fmt.Errorf("%d %s", resp.StatusCode, answer)
	}
	return nil
}

func benchHTTPClient() *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        128,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		},
	}
}

// load runs clients workers for dur; each calls do in a loop and its successful calls' latencies
// are kept. It returns them (sorted), the elapsed time and the first error.
func benchLoad(clients int, dur time.Duration, do func(worker, i int) error) (lat []time.Duration, elapsed time.Duration, errs int, firstErr error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	begin := time.Now()
	deadline := begin.Add(dur)
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := make([]time.Duration, 0, 4096)
			bad := 0
			var first error
			for i := 0; time.Now().Before(deadline); i++ {
				t0 := time.Now()
				if err := do(w, i); err != nil {
					bad++
					if first == nil {
						first = err
					}
					continue
				}
				own = append(own, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, own...)
			errs += bad
			if firstErr == nil {
				firstErr = first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed = time.Since(begin)
	slices.Sort(lat)
	return lat, elapsed, errs, firstErr
}

func benchQuantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func benchMS(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
}

func benchVerdict(ratio float64) string { return benchVerdictAt(ratio, benchTargetRate) }

func benchVerdictAt(ratio, target float64) string {
	if ratio >= target {
		return fmt.Sprintf("target ≥ %.1f met", target)
	}
	return fmt.Sprintf("BELOW TARGET %.1f", target)
}

// benchRSSVerdict says whether a peak RSS in MB is under benchTargetRSS.
func benchRSSVerdict(rss float64) string {
	if rss >= benchTargetRSS {
		return fmt.Sprintf("ABOVE TARGET %d MB", benchTargetRSS)
	}
	return fmt.Sprintf("target < %d MB met", benchTargetRSS)
}

// benchPeakRSS is the process's peak resident set size (VmHWM) in MB.
func benchPeakRSS(b *testing.B, pid int) float64 {
	b.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				b.Fatalf("VmHWM: %q", line)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmHWM in /proc status")
	return 0
}

// benchEventTemplate is a signed-to-be customer.subscription.updated event of benchEventBytes,
// padded in the subscription's metadata, with placeholder event and subscription ids.
func benchEventTemplate(b *testing.B) []byte {
	b.Helper()
	now := time.Now()
	raw := stripeevents.SubscriptionEvent(benchEvtPlaceholder, benchEventType, now, false, stripeevents.Subscription{
		ID: benchSubPlaceholder, Customer: "cus_bench", Status: "active", PriceID: "price_bench",
		CurrentPeriodStart: now, CurrentPeriodEnd: now.AddDate(0, 1, 0),
	})
	out := benchPad(b, raw)
	if bytes.Count(out, []byte(benchEvtPlaceholder)) != 1 {
		b.Fatal("event template: the event id must appear once")
	}
	return out
}

// benchPad pads an event's data.object metadata up to benchEventBytes.
func benchPad(b *testing.B, raw []byte) []byte {
	b.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var ev map[string]any
	if err := dec.Decode(&ev); err != nil {
		b.Fatal(err)
	}
	obj := ev["data"].(map[string]any)["object"].(map[string]any)
	meta := map[string]any{"order_ref": "bench", "padding": ""}
	obj["metadata"] = meta
	base, _ := json.Marshal(ev)
	meta["padding"] = strings.Repeat("x", max(0, benchEventBytes-len(base)))
	out, err := json.Marshal(ev)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// benchWaitDrained polls until no stored event is waiting to be applied; fatal when some still
// are limit after since.
func benchWaitDrained(b *testing.B, d *benchDB, since time.Time, limit time.Duration) {
	b.Helper()
	for {
		var waiting int
		if err := d.db.QueryRow(`SELECT count(*) FROM webhook_events WHERE status = 'received'`).Scan(&waiting); err != nil {
			b.Fatal(err)
		}
		if waiting == 0 {
			return
		}
		if time.Since(since) > limit {
			b.Fatalf("%d events still waiting %s after the last delivery", waiting, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkIngest: 32 concurrent senders post distinct signed ~3 KB customer.subscription.updated
// events for 10 s; accepted events/s and acknowledgement latency, against pgbench running the
// same durable writes per event (the webhook_events insert and River's job insert in one
// transaction) on the same cluster; the time until every accepted event is processed; and the
// service's peak RSS.
func BenchmarkIngest(b *testing.B) {
	d := startBenchDB(b)
	tmpl := benchEventTemplate(b)

	// The ceiling first, on the fresh schema; then its rows go, so that the service starts from
	// the same empty tables.
	var ceiling benchCeiling
	ceiling.before = d.pgbench(b, benchIngestScript(b, d, tmpl), benchClients, benchDuration)
	d.exec(b, `TRUNCATE webhook_events, river_job CASCADE`)
	d.exec(b, `CHECKPOINT`)
	// The same rows written the way the service writes them, in one statement: PostgreSQL's
	// ceiling for the service's exact SQL, reported beside the baseline.
	sameSQL := d.pgbench(b, benchIngestStatementScript(b, d, tmpl), benchClients, benchDuration)
	d.exec(b, `TRUNCATE webhook_events, river_job CASCADE`)
	d.exec(b, `CHECKPOINT`)

	p := startBenchService(b, d, nil)
	client := benchHTTPClient()
	url := p.url("/webhooks/stripe")
	lat, elapsed, errs, firstErr := benchLoad(benchClients, benchDuration, func(w, i int) error {
		suffix := fmt.Sprintf("%02d%010d", w, i)
		body := bytes.ReplaceAll(tmpl, []byte(benchEvtPlaceholder), []byte("evt_bench_"+suffix))
		body = bytes.ReplaceAll(body, []byte(benchSubPlaceholder), []byte("sub_bench_"+suffix))
		return benchPostEvent(client, url, body)
	})
	sendEnd := time.Now()
	var processedDuring int
	if err := d.db.QueryRow(`SELECT count(*) FROM webhook_events WHERE status = 'processed'`).Scan(&processedDuring); err != nil {
		b.Fatal(err)
	}
	accepted := len(lat)
	if accepted == 0 {
		b.Fatalf("no event accepted (%d errors, first: %v)", errs, firstErr)
	}
	if errs > 0 {
		b.Errorf("%d deliveries not accepted; first: %v", errs, firstErr)
	}

	// Drained: no accepted event left unprocessed.
	var received, processed, failed int
	for {
		err := d.db.QueryRow(`SELECT count(*) FILTER (WHERE status = 'received'), count(*) FILTER (WHERE status = 'processed'),
			count(*) FILTER (WHERE status = 'failed') FROM webhook_events`).Scan(&received, &processed, &failed)
		if err != nil {
			b.Fatal(err)
		}
		if received == 0 {
			break
		}
		if time.Since(sendEnd) > 5*time.Minute {
			b.Fatalf("%d events still unprocessed 5 minutes after the last delivery", received)
		}
		time.Sleep(20 * time.Millisecond)
	}
	drained := time.Since(sendEnd)
	if processed != accepted || failed != 0 {
		b.Errorf("accepted %d events; processed %d, failed %d", accepted, processed, failed)
	}
	rss := benchPeakRSS(b, p.cmd.Process.Pid)
	if code := p.stop(b, syscall.SIGTERM); code != 0 {
		b.Errorf("billing exited %d after SIGTERM", code)
	}
	d.exec(b, `TRUNCATE webhook_events, river_job CASCADE`)
	d.exec(b, `CHECKPOINT`)
	ceiling.after = d.pgbench(b, benchIngestScript(b, d, tmpl), benchClients, benchDuration)

	rate := float64(accepted) / elapsed.Seconds()
	ratio := rate / ceiling.tps()
	rssVerdict := benchRSSVerdict(rss)
	fmt.Printf("ingest: %.0f events/s (%s, ratio %.2f, %s; pgbench of the service's one statement %.0f tps, ratio %.2f), p50 %s p99 %s, drained in %.1fs (processed %.0f/s during the run, %.0f/s after), peak RSS %.0f MB (%s) [%d events of %d bytes, %d clients, PostgreSQL %s]\n",
		rate, ceiling, ratio, benchVerdict(ratio), sameSQL.tps, rate/sameSQL.tps, benchMS(benchQuantile(lat, 0.50)), benchMS(benchQuantile(lat, 0.99)),
		drained.Seconds(), float64(processedDuring)/elapsed.Seconds(), float64(accepted-processedDuring)/drained.Seconds(), rss, rssVerdict,
		accepted, len(tmpl), benchClients, d.serverVersion(b))
	b.ReportMetric(rate, "events/s")
	b.ReportMetric(ceiling.tps(), "pgbench-tps")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(sameSQL.tps, "pgbench-stmt-tps")
	b.ReportMetric(float64(benchQuantile(lat, 0.99))/float64(time.Millisecond), "p99-ms")
	b.ReportMetric(drained.Seconds(), "drain-s")
	b.ReportMetric(rss, "peak-RSS-MB")
}

var benchPgbenchVariable = regexp.MustCompile(`:[A-Za-z_]`)

// benchPayloadText splits the jsonb text of the event template around its event id, for
// pgbench scripts (jsonb's own text form puts a space after every ':', so that pgbench takes no
// part of the payload for one of its :variables; checked).
func benchPayloadText(b *testing.B, d *benchDB, tmpl []byte) (prefix, suffix string) {
	b.Helper()
	var payload string
	if err := d.db.QueryRow(`SELECT CAST($1 AS jsonb)::text`, string(tmpl)).Scan(&payload); err != nil {
		b.Fatal(err)
	}
	prefix, suffix, ok := strings.Cut(payload, benchEvtPlaceholder)
	if !ok || strings.Contains(payload, "'") {
		b.Fatal("unexpected payload text")
	}
	if benchPgbenchVariable.MatchString(prefix) || benchPgbenchVariable.MatchString(suffix) {
		b.Fatal("the payload would be read as pgbench variables")
	}
	return prefix, suffix
}

// benchIngestStatementScript is the service's own receive statement (webhooks.Inbox.store): the
// event row and its job in one statement of data-modifying CTEs.
func benchIngestStatementScript(b *testing.B, d *benchDB, tmpl []byte) string {
	b.Helper()
	prefix, suffix := benchPayloadText(b, d, tmpl)
	return `\set n random(1, 999999999999)
WITH event AS (
  INSERT INTO webhook_events (event_id, source, type, livemode, api_version, status, payload, received_at, failure_reason, event_created)
  VALUES ('evt_pgbench_' || :client_id || '_' || :n, 'stripe', '` + benchEventType + `', false, '2024-06-20', 'received',
    CAST('` + prefix + `' || 'evt_pgbench_' || :client_id || '_' || :n || '` + suffix + `' AS jsonb), now(), NULL, now())
  ON CONFLICT (event_id, livemode) DO NOTHING
  RETURNING event_id, livemode, status
), job AS (
  INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, scheduled_at)
  SELECT CAST('{"event_id": "' || event_id || '"}' AS jsonb), 'webhook_event', CAST(25 AS smallint), CAST(1 AS smallint), 'webhooks', 'available', now()
  FROM event WHERE status = 'received'
), dead AS (
  INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error, dead_at)
  SELECT event_id, livemode, 0, CAST(NULL AS text), now() FROM event WHERE status = 'failed'
)
SELECT event_id FROM event;
`
}

// benchIngestScript is the pgbench transaction of one event: the receive path's INSERT into
// webhook_events (a ~3 KB jsonb payload, the event template with a unique id) and River's
// InsertTx (its JobInsertFastMany statement, with one job), in one transaction. The jobs go to
// the real queue; no worker runs while pgbench does, and the rows are truncated afterwards.
func benchIngestScript(b *testing.B, d *benchDB, tmpl []byte) string {
	b.Helper()
	prefix, suffix := benchPayloadText(b, d, tmpl)
	return `\set n random(1, 999999999999)
BEGIN;
INSERT INTO webhook_events (event_id, source, type, livemode, api_version, status, payload, received_at, failure_reason, event_created)
VALUES ('evt_pgbench_' || :client_id || '_' || :n, 'stripe', '` + benchEventType + `', false, '2024-06-20', 'received',
  CAST('` + prefix + `' || 'evt_pgbench_' || :client_id || '_' || :n || '` + suffix + `' AS jsonb),
  now(), NULL, now())
ON CONFLICT (event_id, livemode) DO NOTHING;
WITH raw_job_data AS (
  SELECT
    unnest(ARRAY[0]::bigint[]) AS id,
    unnest(ARRAY[CAST('{"event_id": "evt_pgbench_' || :client_id || '_' || :n || '"}' AS jsonb)]) AS args,
    unnest(ARRAY[now()]::timestamptz[]) AS created_at,
    unnest(ARRAY['webhook_event']::text[]) AS kind,
    unnest(ARRAY[25]::smallint[]) AS max_attempts,
    unnest(ARRAY['{}']::jsonb[]) AS metadata,
    unnest(ARRAY[1]::smallint[]) AS priority,
    unnest(ARRAY['webhooks']::text[]) AS queue,
    unnest(ARRAY[now()]::timestamptz[]) AS scheduled_at,
    unnest(ARRAY['available']::text[]) AS state,
    unnest(ARRAY['']::text[]) AS tags,
    unnest(ARRAY[NULL]::bytea[]) AS unique_key,
    unnest(ARRAY[0]::integer[]) AS unique_states
)
INSERT INTO river_job (id, args, created_at, kind, max_attempts, metadata, priority, queue, scheduled_at, state, tags, unique_key, unique_states)
SELECT
  coalesce(nullif(id, 0), nextval('river_job_id_seq'::regclass)), args,
  coalesce(nullif(created_at, '0001-01-01 00:00:00 +0000'), now()), kind, max_attempts,
  coalesce(metadata, '{}'::jsonb), priority, queue,
  coalesce(nullif(scheduled_at, '0001-01-01 00:00:00 +0000'), now()),
  state::river_job_state, string_to_array(tags, ',')::varchar(255)[],
  nullif(unique_key, '')::bytea, nullif(unique_states::integer, 0)::bit(8)
FROM raw_job_data
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND unique_states IS NOT NULL
  AND river_job_state_in_bitmask(unique_states, state)
  DO UPDATE SET kind = river_job.kind
RETURNING river_job.*, (xmax != 0) AS unique_skipped_as_duplicate;
COMMIT;
`
}

// benchEntitlementQuery is the one statement GET /v1/customers/{user_id}/entitlement runs
// (billing's customerWithSubscriptions), a point select by user_id joined to the customer's
// subscriptions and features, with USER standing for the user id.
const benchEntitlementQuery = `SELECT c.stripe_customer_id, c.livemode, coalesce(s.subscription_id, ''), coalesce(s.stripe_customer_id, ''), coalesce(s.livemode, false),
	coalesce(s.status, ''), s.price_id, s.current_period_start, s.current_period_end, coalesce(s.cancel_at_period_end, false),
	s.cancel_at, s.canceled_at, s.ended_at, s.trial_start, s.trial_end, s.status_since, s.sub_event_id, s.sub_event_created,
	s.trial_will_end_at, coalesce(s.payment_hold, false), s.payment_hold_since, s.latest_invoice_id, s.attempt_count,
	s.next_payment_attempt, s.amount_due, s.currency, s.hosted_invoice_url, s.inv_event_created, f.lookup_keys, c.user_id
  FROM customers c LEFT JOIN subscriptions s ON s.stripe_customer_id = c.stripe_customer_id
  LEFT JOIN customer_features f ON f.stripe_customer_id = c.stripe_customer_id AND f.livemode = c.livemode
  WHERE c.user_id = USER AND c.stripe_customer_id IS NOT NULL
  ORDER BY s.created_at, s.subscription_id`

// benchEntitlementScript is that statement for a random user, as a pgbench script.
var benchEntitlementScript = `\set uid random(1, ` + strconv.Itoa(benchUsers) + `)
` + strings.Replace(benchEntitlementQuery, "USER", "'user_' || :uid", 1) + ";\n"

// benchSeedUsers stores benchUsers users with testenv.SeedUsers: user_i linked to cus_bench_i
// with an active subscription (every tenth past_due with a payment hold), every fifth also with
// an old canceled one.
func benchSeedUsers(b *testing.B, d *benchDB) {
	b.Helper()
	if err := testenv.SeedUsers(d.db, benchUsers); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkEntitlement: GET /v1/customers/{user_id}/entitlement at 32 concurrency over 10,000
// users (customers and subscriptions seeded with SQL; every fifth user also has a canceled
// subscription, every tenth is past_due with a payment hold) → requests/s and p99, against
// pgbench running the same SELECT for a random user on the same tables, and against the bare
// net/http+pgx server (benchBareHandler) under the same loads.
//
// The feature gate (GET /v1/customers/{user_id}/features/{lookup_key}, the hot path of every
// gated request in the app) is loaded in the same rounds: its throughput must be within 0.9 of
// the entitlement's.
//
// The service and the bare server are compared in benchEntitlementRounds rounds, each loading
// every one of them in turn for benchRoundDuration, and each ratio is the median of its rounds':
// on a shared host the machine's speed drifts by tens of percent within a minute, and a drift
// then falls on both sides of a ratio instead of on one.
func BenchmarkEntitlement(b *testing.B) {
	d := startBenchDB(b)
	benchSeedUsers(b, d)

	var ceiling benchCeiling
	ceiling.before = d.pgbench(b, benchEntitlementScript, benchClients, benchDuration)

	p := startBenchService(b, d, nil)
	// A fresh process's first seconds are not its steady state: its pool opens its connections,
	// each prepares the statement, and each new PostgreSQL backend fills its caches.
	benchEntitlementLoad(p.url(""), 2*time.Second)
	profiled := benchProfile(b, p, "entitlement", benchDuration-2*time.Second)
	lat, elapsed, errs, firstErr := benchEntitlementLoad(p.url(""), benchDuration)
	profiled()
	if len(lat) == 0 {
		b.Fatalf("no request answered (%d errors, first: %v)", errs, firstErr)
	}
	if errs > 0 {
		b.Errorf("%d requests failed; first: %v", errs, firstErr)
	}

	// The floor of any Go HTTP service on this machine: net/http, a pgx pool and the same
	// statement, nothing else. What the service loses against pgbench beyond what this loses is
	// the service's own cost. It runs here, in the load generator's process, as the bench has
	// always run it, and as a process of its own, as the service runs.
	bare := benchBareEntitlementServer(b, d)
	own, ownPID := benchBareEntitlementProcess(b, d)
	svcPID := p.cmd.Process.Pid
	goClient := func(base string) func() float64 {
		return func() float64 {
			lat, elapsed, errs, err := benchEntitlementLoad(base, benchRoundDuration)
			if errs > 0 || len(lat) == 0 {
				b.Errorf("%s: %d requests failed (%d answered); first: %v", base, errs, len(lat), err)
			}
			return float64(len(lat)) / elapsed.Seconds()
		}
	}
	runs := []*benchEntitlementRun{
		{name: "service", pid: svcPID, load: goClient(p.url(""))},
		{name: "bare, in the load generator's process", load: goClient(bare)},
		{name: "bare, in its own process", pid: ownPID, load: goClient(own)},
	}
	feature := &benchEntitlementRun{name: "service, feature gate", pid: svcPID, load: func() float64 {
		lat, elapsed, errs, err := benchFeatureLoad(p.url(""), benchRoundDuration)
		if errs > 0 || len(lat) == 0 {
			b.Errorf("feature gate: %d requests failed (%d answered); first: %v", errs, len(lat), err)
		}
		return float64(len(lat)) / elapsed.Seconds()
	}}
	runs = append(runs, feature)
	// wrk is a C load generator in a process of its own, as lean as pgbench's client: on 2
	// vCPUs the Go client takes CPU from the server it loads, and in the load generator's
	// process the bare server shares one Go runtime (scheduler, GC, threads) with it, which no
	// separate service can. Under wrk the bare server is the same one, and runs alone in its
	// process, so the two are compared on equal terms.
	_, wrkErr := exec.LookPath("wrk")
	haveWrk := wrkErr == nil
	if haveWrk {
		wrkLoad := func(base string) func() float64 {
			return func() float64 {
				if r := benchWrkEntitlement(b, base, benchClients, benchRoundDuration); r != nil {
					return r.rate
				}
				return 0
			}
		}
		runs = append(runs,
			&benchEntitlementRun{name: "service (wrk)", pid: svcPID, load: wrkLoad(p.url(""))},
			&benchEntitlementRun{name: "bare (wrk)", load: wrkLoad(bare)})
	}
	for range benchEntitlementRounds {
		for _, r := range runs {
			r.measure()
		}
	}

	rss := benchPeakRSS(b, svcPID)
	if code := p.stop(b, syscall.SIGTERM); code != 0 {
		b.Errorf("billing exited %d after SIGTERM", code)
	}
	ceiling.after = d.pgbench(b, benchEntitlementScript, benchClients, benchDuration)

	rate := float64(len(lat)) / elapsed.Seconds()
	pgTPS := ceiling.tps()
	ratio := rate / pgTPS
	fmt.Printf("entitlement: %.0f req/s (%s, ratio %.2f, %s), p50 %s p99 %s (pgbench avg %s), peak RSS %.0f MB (%s) [%d users, %d clients, PostgreSQL %s]\n",
		rate, ceiling, ratio, benchVerdict(ratio), benchMS(benchQuantile(lat, 0.50)), benchMS(benchQuantile(lat, 0.99)), benchMS(ceiling.latency()),
		rss, benchRSSVerdict(rss), benchUsers, benchClients, d.serverVersion(b))
	for _, r := range runs {
		fmt.Printf("entitlement, %s: %s req/s in %d rounds of %s\n", r.name, r.rates(), benchEntitlementRounds, benchRoundDuration)
	}
	svc, inProc, ownProc := runs[0], runs[1], runs[2]
	ownRatio := benchMedianRatio(svc, ownProc)
	headline, headlineRatio := "the bare server in its own process (Go client; apt-get install wrk for the comparison under wrk)", ownRatio
	if haveWrk {
		headline, headlineRatio = "the bare server under wrk", benchMedianRatio(runs[4], runs[5])
	}
	featureRatio := benchMedianRatio(feature, svc)
	fmt.Printf("entitlement, feature gate / entitlement read: %.2f (%s; CPU per request %.0f µs against %.0f µs)\n",
		featureRatio, benchVerdictAt(featureRatio, 0.9), feature.cpuPerRequest(), svc.cpuPerRequest())
	fmt.Printf("entitlement, service / bare: %.2f against %s (%s); Go client: %.2f against the bare server in its own process, %.2f against it in the load generator's process\n",
		headlineRatio, headline, benchVerdictAt(headlineRatio, 0.9), ownRatio, benchMedianRatio(svc, inProc))
	// CPU per answered request of each process: steadier than throughput on a shared host.
	svcCPU, ownCPU := svc.cpuPerRequest(), ownProc.cpuPerRequest()
	fmt.Printf("entitlement, CPU per request (Go client, median of rounds): service %.0f µs, bare server in its own process %.0f µs (bare / service %.2f)\n",
		svcCPU, ownCPU, ownCPU/max(svcCPU, 1))
	b.ReportMetric(rate, "req/s")
	b.ReportMetric(pgTPS, "pgbench-tps")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(float64(benchQuantile(lat, 0.99))/float64(time.Millisecond), "p99-ms")
	b.ReportMetric(headlineRatio, "service/bare")
	b.ReportMetric(featureRatio, "feature/entitlement")
	b.ReportMetric(rss, "peak-RSS-MB")
}

// Rounds of the entitlement comparison, and the length of each run in a round.
const (
	benchEntitlementRounds = 5
	benchRoundDuration     = 5 * time.Second
)

// benchEntitlementRun is one of the servers BenchmarkEntitlement compares, under one load:
// its rate in each round, and (when pid is set) its process's CPU per request.
type benchEntitlementRun struct {
	name  string
	pid   int
	load  func() (reqPerSec float64)
	rate  []float64
	cpuPR []float64 // µs per request
}

func (r *benchEntitlementRun) measure() {
	var cpu0 time.Duration
	if r.pid != 0 {
		cpu0 = benchCPUTime(r.pid)
	}
	rate := r.load()
	r.rate = append(r.rate, rate)
	if r.pid != 0 && rate > 0 {
		cpu := benchCPUTime(r.pid) - cpu0
		r.cpuPR = append(r.cpuPR, float64(cpu.Microseconds())/(rate*benchRoundDuration.Seconds()))
	}
}

func (r *benchEntitlementRun) rates() string { return benchFigures(r.rate, 0) }

func (r *benchEntitlementRun) cpuPerRequest() float64 { return benchMedian(r.cpuPR) }

// benchMedianRatio is the median over the rounds of a's rate / b's rate in the same round.
func benchMedianRatio(a, b *benchEntitlementRun) float64 {
	var ratios []float64
	for i := range min(len(a.rate), len(b.rate)) {
		if b.rate[i] > 0 {
			ratios = append(ratios, a.rate[i]/b.rate[i])
		}
	}
	return benchMedian(ratios)
}

func benchMedian(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// benchFigures lists v with prec decimals, comma-separated.
func benchFigures(v []float64, prec int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.FormatFloat(x, 'f', prec, 64)
	}
	return strings.Join(parts, ", ")
}

// benchEntitlementLoad drives GET {base}/v1/customers/{random user}/entitlement with the Go
// client at benchClients concurrency for dur; a request counts when answered 200
// with the user's id.
func benchEntitlementLoad(base string, dur time.Duration) (lat []time.Duration, elapsed time.Duration, errs int, firstErr error) {
	client := benchHTTPClient()
	return benchLoad(benchClients, dur, func(w, i int) error {
		return benchGetEntitlement(client, base, benchUsers)
	})
}

// benchFeatureLoad drives GET {base}/v1/customers/{random user}/features/{one of the seeded
// features, or one no user has} as benchEntitlementLoad drives the entitlement.
func benchFeatureLoad(base string, dur time.Duration) (lat []time.Duration, elapsed time.Duration, errs int, firstErr error) {
	client := benchHTTPClient()
	return benchLoad(benchClients, dur, func(w, i int) error {
		user := "user_" + strconv.Itoa(1+rand.IntN(benchUsers))
		feature := fmt.Sprintf("feature_%02d", rand.IntN(testenv.SeedFeatures+1))
		req, err := http.NewRequest(http.MethodGet, base+"/v1/customers/"+user+"/features/"+feature, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+benchAPIToken)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"feature":"`+feature+`"`)) {
			return fmt.Errorf("%s %s: %d %s", user, feature, resp.StatusCode, body)
		}
		return nil
	})
}

// benchGetEntitlement reads the entitlement of a random one of users users; nil when answered 200
// with the user's id.
func benchGetEntitlement(client *http.Client, base string, users int) error {
	user := "user_" + strconv.Itoa(1+rand.IntN(users))
	req, err := http.NewRequest(http.MethodGet, base+"/v1/customers/"+user+"/entitlement", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+benchAPIToken)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"user_id":"`+user+`"`)) {
		return fmt.Errorf("%s: %d %s", user, resp.StatusCode, body)
	}
	return nil
}

// benchBareEntitlementServer serves the entitlement route from this process with only net/http,
// a pgx pool (as many connections as the service's pool) and benchEntitlementQuery, answering
// the first subscription's status: no router, middleware, logs, metrics or policy. It returns
// its base URL; it stops with the benchmark.
func benchBareEntitlementServer(b *testing.B, d *benchDB) string {
	b.Helper()
	pool, err := benchBarePool(d.url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: benchBareHandler(pool), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func benchBarePool(url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 40
	return pgxpool.NewWithConfig(context.Background(), cfg)
}

// The environment of the test binary re-run as the bare server (see benchServeBare).
const (
	benchBareDBEnv   = "BENCH_BARE_SERVE_DATABASE_URL"
	benchBareAddrEnv = "BENCH_BARE_SERVE_ADDR"
)

// benchServeBare runs the bare server until the process is killed, when the test binary was
// started as one by benchBareEntitlementProcess; false otherwise.
func benchServeBare() bool {
	url, addr := os.Getenv(benchBareDBEnv), os.Getenv(benchBareAddrEnv)
	if url == "" || addr == "" {
		return false
	}
	pool, err := benchBarePool(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare server:", err)
		os.Exit(1)
	}
	srv := &http.Server{Addr: addr, Handler: benchBareHandler(pool), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, "bare server:", srv.ListenAndServe())
	os.Exit(1)
	return true
}

// benchBareEntitlementProcess starts the bare server as a process of its own (this test binary
// re-run) and returns its base URL once it accepts connections.
func benchBareEntitlementProcess(b *testing.B, d *benchDB) (url string, pid int) {
	b.Helper()
	addr := freeAddr(b)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), benchBareDBEnv+"="+d.url, benchBareAddrEnv+"="+addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("start the bare server: %v", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return "http://" + addr, cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			b.Fatalf("the bare server does not listen on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// benchBareHandler: net/http, a pgx pool and the entitlement statement, nothing else.
func benchBareHandler(pool *pgxpool.Pool) http.Handler {
	query := strings.Replace(benchEntitlementQuery, "USER", "$1", 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/customers/{user_id}/entitlement", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+benchAPIToken {
			http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		rows, err := pool.Query(r.Context(), query, r.PathValue("user_id"))
		if err != nil {
			http.Error(w, `{"error":"database"}`, http.StatusServiceUnavailable)
			return
		}
		var answer struct {
			UserID         string  `json:"user_id"`
			Status         string  `json:"status"`
			SubscriptionID *string `json:"subscription_id"`
			Columns        int     `json:"columns"`
		}
		for rows.Next() {
			values, err := rows.Values()
			if err != nil {
				break
			}
			if answer.UserID == "" {
				answer.UserID, _ = values[len(values)-1].(string)
				answer.Status, _ = values[5].(string)
				if id, _ := values[2].(string); id != "" {
					answer.SubscriptionID = &id
				}
				answer.Columns = len(values)
			}
		}
		rows.Close()
		if rows.Err() != nil || answer.UserID == "" {
			http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(answer)
	})
	return mux
}

type benchWrkResult struct {
	rate float64
	p99  string
}

// benchWrkEntitlement drives the entitlement endpoint with wrk (random user per request), or
// returns nil when wrk is not installed.
func benchWrkEntitlement(b *testing.B, base string, clients int, dur time.Duration) *benchWrkResult {
	b.Helper()
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		return nil
	}
	script := filepath.Join(b.TempDir(), "entitlement.lua")
	lua := fmt.Sprintf(`math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/v1/customers/user_" .. math.random(1, %d) .. "/entitlement",
    {["Authorization"] = "Bearer %s"})
end
`, benchUsers, benchAPIToken)
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		b.Fatal(err)
	}
	out, err := exec.Command(wrk, "-t2", "-c"+strconv.Itoa(clients), "-d"+strconv.Itoa(int(dur.Seconds()))+"s",
		"--latency", "-s", script, base).CombinedOutput()
	if err != nil {
		b.Errorf("wrk: %v\n%s", err, out)
		return nil
	}
	text := string(out)
	if strings.Contains(text, "Non-2xx") {
		b.Errorf("wrk saw failed requests:\n%s", text)
	}
	rate := regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`).FindStringSubmatch(text)
	p99 := regexp.MustCompile(`\s99%\s+(\S+)`).FindStringSubmatch(text)
	if rate == nil || p99 == nil {
		b.Errorf("unexpected wrk output:\n%s", text)
		return nil
	}
	r, _ := strconv.ParseFloat(rate[1], 64)
	return &benchWrkResult{rate: r, p99: p99[1]}
}

// BenchmarkReconcile runs `billing reconcile` against an account of BENCH_RECONCILE_SUBS
// (default 100,000) subscriptions in the double, each list page answered after 100 ms, twice:
// on the empty database (the backfill: every subscription imported, a customer per 100 linked)
// and again (nothing differs: listing and comparing only). It reports objects and pages per
// second, their ratio to the page ceiling (Stripe's pace: 100 objects a page, one page per
// 100 ms; the target of the backfill is 0.9 of it) and the command's peak RSS for each; nothing
// is asserted.
func BenchmarkReconcile(b *testing.B) {
	subs := benchCountEnv(b, "BENCH_RECONCILE_SUBS", 100000)
	const pageDelay = 100 * time.Millisecond
	// reconcile lists Stripe's largest page: the run cannot go faster than one a pageDelay.
	const pageObjects = 100
	ceiling := pageObjects / pageDelay.Seconds()
	d := startBenchDB(b)
	// Every path the command calls is the account's: nothing reaches the upstream.
	proxy := stripeemu.New(b, "http://127.0.0.1:9")
	acct := stripeemu.NewAccount(proxy, false)
	start := time.Now().Add(-24 * time.Hour).Truncate(time.Second)
	var customer string
	for i := range subs {
		if i%100 == 0 {
			customer = acct.AddCustomer(stripeemu.CustomerSpec{Email: fmt.Sprintf("u%d@example.com", i),
				Metadata: map[string]string{"user_id": fmt.Sprintf("user_%d", i)}})
		}
		acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: customer, Status: "active", PriceID: "price_bench",
			CurrentPeriodStart: start, CurrentPeriodEnd: start.AddDate(0, 1, 0),
			LatestInvoice: &stripeemu.InvoiceSpec{Status: "paid", AttemptCount: 1, AmountDue: 2000}})
	}
	acct.SetPageDelay(pageDelay)
	env := map[string]string{
		"BILLING_DATABASE_URL":      d.url,
		"BILLING_STRIPE_API_URL":    proxy.URL,
		"BILLING_STRIPE_SECRET_KEY": "sk_test_bench",
		"BILLING_LOG_LEVEL":         "warn",
	}
	b.ResetTimer()
	for range b.N {
		for _, phase := range []string{"backfill", "steady"} {
			pages := acct.Stats().Pages
			t0 := time.Now()
			cmd := exec.Command(binary(b), "reconcile")
			cmd.Dir, cmd.Env = d.dir, baseEnv(env)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			// The child's own high-water mark (VmHWM), read until it exits: the rusage of a
			// child started by os/exec also counts this process's size at the fork.
			var rss float64
			exited, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					if v, ok := vmHWM(cmd.Process.Pid); ok {
						rss = max(rss, v)
					}
					select {
					case <-exited:
						return
					case <-tick.C:
					}
				}
			}()
			err := cmd.Wait()
			close(exited)
			<-done
			elapsed := time.Since(t0)
			code := cmd.ProcessState.ExitCode()
			if err != nil && code != 0 && code != 1 {
				b.Fatalf("billing reconcile (%s): %v\nstdout: %s\nstderr (tail): %s", phase, err, stdout.String(), tail(stderr.String(), 2000))
			}
			n := acct.Stats().Pages - pages
			rate := float64(subs) / elapsed.Seconds()
			b.Logf("%s: %s exit %d in %s: %.0f objects/s = %.2f × the page ceiling of %.0f/s, %.1f pages/s (%d pages, %s each at the double), peak RSS %.0f MB",
				phase, strings.TrimSpace(stdout.String()), code, elapsed.Round(time.Millisecond),
				rate, rate/ceiling, ceiling, float64(n)/elapsed.Seconds(), n, pageDelay, rss)
			b.ReportMetric(rate, phase+"-objects/s")
			b.ReportMetric(rate/ceiling, phase+"-x-ceiling")
			b.ReportMetric(float64(n)/elapsed.Seconds(), phase+"-pages/s")
			b.ReportMetric(rss, phase+"-peak-RSS-MB")
		}
	}
}

// benchCPUTime is the user and system CPU a process has used (/proc/<pid>/stat, in the kernel's
// 100 Hz ticks), or 0 when it cannot be read.
func benchCPUTime(pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces) start at state, field 3.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// vmHWM is a live process's peak resident set size in MB; ok is false once it is gone.
func vmHWM(pid int) (float64, bool) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return kb / 1024, err == nil
		}
	}
	return 0, false
}
