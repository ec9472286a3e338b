package billing

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"billing/internal/auth"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/logging"
	"billing/internal/testenv"
)

const (
	benchEntUsers = 1000
	benchEntToken = "bench-entitlement-app-token-0123456789"
)

// benchEntitlementServer is the entitlement route behind the whole middleware chain main builds
// (request id, security headers, request log at info through logging.Writer, metrics, recoverer,
// app-token auth, the Stripe concurrency limit), on a seeded test database shaped like
// test/bench_test.go's: every fifth user also has a canceled subscription, every tenth is
// past_due with a payment hold.
func benchEntitlementServer(tb testing.TB) *echo.Echo {
	tb.Helper()
	logw := logging.NewWriter(io.Discard, 0)
	tb.Cleanup(func() { _ = logw.Close() })
	logger := slog.New(slog.NewJSONHandler(logw, nil))
	db, err := database.Open(context.Background(), testenv.DatabaseURL(tb), logger)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = database.SQL(db).Close() })
	database.SizePool(database.SQL(db), database.DefaultWorkers)
	for _, stmt := range []string{
		`INSERT INTO customers (user_id, stripe_customer_id, email, name, livemode)
		SELECT 'user_' || g, 'cus_bench_' || g, 'user' || g || '@example.com', 'User ' || g, false
		FROM generate_series(1, $1::int) g`,
		`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status, price_id,
			current_period_start, current_period_end, status_since, sub_event_id, sub_event_type, sub_event_created, sub_event_rank,
			payment_hold, payment_hold_since, created_at, updated_at)
		SELECT 'sub_bench_' || g, 'cus_bench_' || g, false, CASE WHEN g % 10 = 0 THEN 'past_due' ELSE 'active' END, 'price_bench',
			now() - interval '5 days', now() + interval '25 days', now() - interval '5 days', 'evt_seed_' || g,
			'customer.subscription.created', now() - interval '5 days', 10,
			g % 10 = 0, CASE WHEN g % 10 = 0 THEN now() - interval '1 day' END, now() - interval '5 days', now()
		FROM generate_series(1, $1::int) g`,
		`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status, price_id,
			current_period_start, current_period_end, canceled_at, ended_at, status_since, sub_event_id, sub_event_type, sub_event_created,
			sub_event_rank, created_at, updated_at)
		SELECT 'sub_old_' || g, 'cus_bench_' || g, false, 'canceled', 'price_old', now() - interval '90 days', now() - interval '60 days',
			now() - interval '60 days', now() - interval '60 days', now() - interval '60 days', 'evt_old_' || g,
			'customer.subscription.deleted', now() - interval '60 days', 32, now() - interval '90 days', now()
		FROM generate_series(5, $1::int, 5) g`,
		`ANALYZE customers`,
		`ANALYZE subscriptions`,
	} {
		var args []any
		if bytes.Contains([]byte(stmt), []byte("$1")) {
			args = append(args, benchEntUsers)
		}
		if _, err := database.SQL(db).Exec(stmt, args...); err != nil {
			tb.Fatalf("seed: %v", err)
		}
	}
	svc := New(Deps{DB: db, Logger: logger, PastDueEntitled: true, PausedCollectionEntitled: true})
	e := httpserver.New(httpserver.Options{
		Logger:   logger,
		Registry: prometheus.NewRegistry(),
		Ready:    func(context.Context) error { return nil },
	})
	tokens := auth.New([]string{benchEntToken}, []string{"bench-entitlement-admin-token-0123456789"})
	v1 := e.Group("/v1", tokens.Require(auth.RoleApp, false),
		httpserver.LimitConcurrency(16, 5*time.Second, httpserver.CallsStripe))
	svc.MountAPI(v1)
	return e
}

// benchWriter is a reusable http.ResponseWriter, so that the benchmark's allocations are the
// server's and not the recorder's.
type benchWriter struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (w *benchWriter) Header() http.Header { return w.header }
func (w *benchWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *benchWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.body.Write(p)
}

func (w *benchWriter) reset() {
	clear(w.header)
	w.code = 0
	w.body.Reset()
}

// BenchmarkEntitlementHandler: GET /v1/customers/{user_id}/entitlement of a random user, served
// in process through the full middleware chain against a real database, 16 requests at a time
// per CPU (the database round trip dominates the wall time; the point is the CPU and the
// allocations per request, see -cpuprofile and -benchmem). Every answer must be 200 and name the
// user.
func BenchmarkEntitlementHandler(b *testing.B) {
	e := benchEntitlementServer(b)
	var failed atomic.Int64
	var firstFailure atomic.Value
	b.SetParallelism(16)
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &benchWriter{header: http.Header{}}
		req, _ := http.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("Authorization", "Bearer "+benchEntToken)
		for pb.Next() {
			user := "user_" + strconv.Itoa(1+rand.IntN(benchEntUsers))
			r := req.Clone(context.Background())
			r.URL.Path = "/v1/customers/" + user + "/entitlement"
			r.RequestURI = r.URL.Path
			w.reset()
			e.ServeHTTP(w, r)
			if w.code != http.StatusOK || !bytes.Contains(w.body.Bytes(), []byte(`"user_id":"`+user+`"`)) {
				if failed.Add(1) == 1 {
					firstFailure.Store(strconv.Itoa(w.code) + " " + w.body.String())
				}
			}
		}
	})
	b.StopTimer()
	// The process's CPU per request (this side's: HTTP handling, the driver, GC), which the
	// wall time per request hides behind the database's round trip.
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d answers were not 200 with the user's id; first: %v", n, firstFailure.Load())
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
