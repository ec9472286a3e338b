package entitlements

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"billing/billing"
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

// benchEntitlementDB is a test database with benchEntUsers users of testenv.SeedUsers (an active
// subscription each, every fifth also with a canceled one, every tenth past_due with a payment
// hold), as the end-to-end benchmark seeds them. It is opened as main opens the service's
// (database.Open).
func benchEntitlementDB(tb testing.TB, logger *slog.Logger) *gorm.DB {
	tb.Helper()
	db, err := database.Open(context.Background(), testenv.DatabaseURL(tb), logger)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = database.SQL(db).Close() })
	if err := testenv.SeedUsers(database.SQL(db), benchEntUsers); err != nil {
		tb.Fatal(err)
	}
	return db
}

// benchEntitlementServer is the entitlement route on db behind the whole middleware chain main
// builds: request id, security headers, the request log at info through logging.Writer, the
// metrics, the recoverer, app-token auth and the Stripe concurrency limit.
func benchEntitlementServer(tb testing.TB, db *gorm.DB, logger *slog.Logger) *echo.Echo {
	tb.Helper()
	svc := New(Deps{DB: db, Billing: billing.New(billing.Deps{DB: db}), Logger: logger, Policy: Policy{PastDueEntitled: true, PausedCollectionEntitled: true}})
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

// benchLogger logs at info in JSON through logging.Writer, as main does, into nothing.
func benchLogger(tb testing.TB) *slog.Logger {
	logw := logging.NewWriter(io.Discard, 0)
	tb.Cleanup(func() { _ = logw.Close() })
	return slog.New(slog.NewJSONHandler(logw, nil))
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
	benchHandler(b, func(user string) (string, string) {
		return "/v1/customers/" + user + "/entitlement", `"user_id":"` + user + `"`
	})
}

// BenchmarkFeatureHandler: GET /v1/customers/{user_id}/features/{lookup_key} as
// BenchmarkEntitlementHandler reads the entitlement, for one of the seeded features or one that
// no user has; it must cost what the entitlement read costs.
func BenchmarkFeatureHandler(b *testing.B) {
	benchHandler(b, func(user string) (string, string) {
		feature := fmt.Sprintf("feature_%02d", rand.IntN(testenv.SeedFeatures+1))
		return "/v1/customers/" + user + "/features/" + feature, `"feature":"` + feature + `"`
	})
}

// benchHandler serves the path that route gives for a random user, whose answer must be 200 and
// contain want.
func benchHandler(b *testing.B, route func(user string) (path, want string)) {
	logger := benchLogger(b)
	e := benchEntitlementServer(b, benchEntitlementDB(b, logger), logger)
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
			path, want := route("user_" + strconv.Itoa(1+rand.IntN(benchEntUsers)))
			r := req.Clone(context.Background())
			r.URL.Path = path
			r.RequestURI = r.URL.Path
			w.reset()
			e.ServeHTTP(w, r)
			if w.code != http.StatusOK || !bytes.Contains(w.body.Bytes(), []byte(want)) {
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
		b.Fatalf("%d answers were not 200 with what they must say; first: %v", n, firstFailure.Load())
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

// The entitlement read (entitlementQuery, fewer columns) answers what Customer's view says, for
// users in every state the seed and the updates below give: active, past_due with a hold,
// authentication_required, trialing, cancelling at period end, collection paused, renewal
// unconfirmed, a canceled subscription beside a live one, no subscription, no customer.
func TestEntitlementReadAgreesWithCustomerView(t *testing.T) {
	t.Parallel()
	db := benchEntitlementDB(t, slog.New(slog.DiscardHandler))
	for _, stmt := range []string{
		`UPDATE subscriptions SET status = 'trialing', trial_start = now() - interval '3 days', trial_end = now() + interval '4 days'
		 WHERE subscription_id IN (SELECT 'sub_bench_' || g FROM generate_series(7, 1000, 7) g)`,
		`UPDATE subscriptions SET cancel_at_period_end = true WHERE subscription_id IN (SELECT 'sub_bench_' || g FROM generate_series(11, 1000, 11) g)`,
		`UPDATE subscriptions SET current_period_end = now() - interval '1 hour' WHERE subscription_id IN (SELECT 'sub_bench_' || g FROM generate_series(33, 1000, 33) g)`,
		`UPDATE subscriptions SET pause_collection_behavior = 'void' WHERE subscription_id IN (SELECT 'sub_bench_' || g FROM generate_series(13, 1000, 13) g)`,
		`UPDATE subscriptions SET payment_hold_kind = 'authentication_required', payment_hold_billing_reason = 'subscription_cycle',
		   inv_event_created = now() - interval '1 day' WHERE subscription_id IN (SELECT 'sub_bench_' || g FROM generate_series(20, 1000, 20) g)`,
		`UPDATE subscriptions SET current_period_end = now() - interval '5 hours' WHERE subscription_id IN (SELECT 'sub_bench_' || g FROM generate_series(17, 1000, 17) g)`,
		`DELETE FROM subscriptions WHERE subscription_id IN (SELECT 'sub_bench_' || g FROM generate_series(19, 1000, 19) g)`,
		`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('user_nolink', NULL, 'n@example.com', false)`,
	} {
		if err := db.Exec(stmt).Error; err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	deps := Deps{DB: db, Billing: billing.New(billing.Deps{DB: db}), Policy: Policy{PastDueEntitled: true, PausedCollectionEntitled: false, PeriodGrace: 2 * time.Hour}}
	svc := New(deps)
	// Through a handle whose pool is not a *sql.DB the read goes through database/sql.
	deps.DB = db.Session(&gorm.Session{PrepareStmt: true})
	viaSQL := New(deps)
	if _, ok := deps.DB.Statement.ConnPool.(*sql.DB); ok {
		t.Fatal("the prepared-statement handle's pool is a *sql.DB: the database/sql path goes untested")
	}
	ctx := context.Background()
	seen := map[string]int{}
	for g := 1; g <= benchEntUsers; g++ {
		user := "user_" + strconv.Itoa(g)
		got, err := svc.Entitlement(ctx, user)
		if err != nil {
			t.Fatalf("Entitlement(%s): %v", user, err)
		}
		gotSQL, err := viaSQL.Entitlement(ctx, user)
		if err != nil {
			t.Fatalf("Entitlement(%s) through database/sql: %v", user, err)
		}
		view, err := svc.Customer(ctx, user)
		if err != nil {
			t.Fatalf("Customer(%s): %v", user, err)
		}
		gotJSON, _ := json.Marshal(got)
		gotSQLJSON, _ := json.Marshal(gotSQL)
		wantJSON, _ := json.Marshal(view.Entitlement)
		if !bytes.Equal(gotJSON, wantJSON) || !bytes.Equal(gotSQLJSON, wantJSON) {
			t.Errorf("%s: Entitlement %s\nthrough database/sql %s\nCustomer's view %s", user, gotJSON, gotSQLJSON, wantJSON)
		}
		key := got.Status + "/" + strconv.FormatBool(got.Entitled) + "/" + strconv.FormatBool(got.OnHold)
		if got.UnconfirmedSince != nil {
			key += "/unconfirmed"
		}
		seen[key]++
		// The feature gate (featureQuery) agrees with the entitlement's list, both ways.
		for _, feature := range []string{"feature_03", "feature_99"} {
			for _, s := range []*Service{svc, viaSQL} {
				a, err := s.Feature(ctx, user, feature)
				if err != nil {
					t.Fatalf("Feature(%s, %s): %v", user, feature, err)
				}
				if a.Allowed != slices.Contains(view.Entitlement.Features, feature) {
					t.Errorf("%s: %s allowed %v, the entitlement's features %v", user, feature, a.Allowed, view.Entitlement.Features)
				}
			}
		}
		if len(got.Features) > 0 {
			seen["features"]++
		}
	}
	// The fixtures must reach the states the comparison is about, or it proves little.
	for _, want := range []string{"active/true/false", "past_due/true/true", "trialing/true/false", "none/false/false",
		"active/false/false/unconfirmed", "active/false/false", "features"} {
		if seen[want] == 0 {
			t.Errorf("no user in state %s; states seen: %v", want, seen)
		}
	}
	for _, user := range []string{"user_nolink", "user_unknown"} {
		for _, s := range []*Service{svc, viaSQL} {
			if _, err := s.Entitlement(ctx, user); !errors.Is(err, ErrNoCustomer) {
				t.Errorf("Entitlement(%s) = %v, want ErrNoCustomer", user, err)
			}
		}
	}
}

// The entitlement's own encoder writes exactly what encoding/json's Encoder (c.JSON) writes, for
// plain and awkward strings (quotes, HTML, control characters, non-ASCII, invalid UTF-8), null
// and set pointers, and times with and without fractions or in other zones; it declines the
// times encoding/json refuses.
func TestEntitlementJSONIsEncodingJSONs(t *testing.T) {
	t.Parallel()
	str := func(s string) *string { return &s }
	tm := func(t time.Time) *time.Time { return &t }
	strs := []string{"", "user_1", "sub_1MowQVLkdIwHu7ixeRlqHVzs", `a"b\c`, "<script>&amp;", "a<b>c", "tab\tnew\nline\x00\x1f\x7f",
		"é ünïcödé ✓", "\u2028\u2029", "bad \xff utf8", "past_due"}
	times := []time.Time{
		time.Date(2026, 12, 4, 17, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 4, 17, 0, 0, 123456000, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", -(23*3600+59*60))),
		time.Date(2024, 2, 29, 12, 30, 0, 500, time.FixedZone("CET", 3600)),
	}
	var cases []Entitlement
	for i, s := range strs {
		for j, at := range times {
			e := Entitlement{UserID: s, Entitled: (i+j)%2 == 0, Status: strs[(i+1)%len(strs)], OnHold: j%2 == 1,
				CancelAtPeriodEnd: i%3 == 0}
			if j%3 != 0 {
				e.HoldReason, e.SubscriptionID, e.PriceID = str(s), str(strs[j]), str(strs[(i+j)%len(strs)])
				e.CurrentPeriodEnd, e.TrialEnd = tm(at), tm(times[(i+j)%len(times)])
			}
			if j%2 == 0 {
				e.UnconfirmedSince = tm(at)
			}
			switch q := int64(i*j - 7); {
			case j == 1:
			case q%2 == 0:
				e.Quantity = &q
			default:
				e.Quantity, e.Features = &q, []string{s, strs[j], strs[(i+j)%len(strs)]}
			}
			if e.Features == nil && i%2 == 0 {
				e.Features = noFeatures
			}
			cases = append(cases, e)
		}
	}
	cases = append(cases, Entitlement{UserID: "u", Status: billing.StatusNone})
	for i, s := range strs {
		a := FeatureAnswer{UserID: s, Feature: strs[(i+3)%len(strs)], Allowed: i%2 == 0, Reason: strs[(i+5)%len(strs)]}
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(&a); err != nil {
			t.Fatal(err)
		}
		if got := appendFeatureJSON(nil, &a); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("feature answer\n got %s\nwant %s", got, want.Bytes())
		}
	}
	for _, e := range cases {
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(&e); err != nil {
			t.Fatal(err)
		}
		got, ok := appendEntitlementJSON(nil, &e)
		if !ok || !bytes.Equal(got, want.Bytes()) {
			t.Errorf("ok=%v\n got %s\nwant %s", ok, got, want.Bytes())
		}
	}
	for _, bad := range []time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 24*3600))} {
		e := Entitlement{UserID: "u", Status: billing.StatusActive, TrialEnd: &bad}
		if _, err := json.Marshal(&e); err == nil {
			t.Fatalf("encoding/json encodes %v; the case tests nothing", bad)
		}
		if _, ok := appendEntitlementJSON(nil, &e); ok {
			t.Errorf("appendEntitlementJSON encoded %v, which encoding/json refuses", bad)
		}
	}
}
