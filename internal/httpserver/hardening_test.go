package httpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"billing/internal/httpserver"
)

// logLines collects the JSON log lines of a server.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// requests returns the "http request" lines.
func (l *logLines) requests(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if m["msg"] == "http request" {
			out = append(out, m)
		}
	}
	return out
}

// fakeClock is a clock a handler can move forward.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type testServer struct {
	e     *echo.Echo
	reg   *prometheus.Registry
	logs  *logLines
	clock *fakeClock
}

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	s := &testServer{reg: prometheus.NewRegistry(), logs: &logLines{}, clock: &fakeClock{t: time.Unix(1_700_000_000, 0)}}
	s.e = httpserver.New(httpserver.Options{
		Logger:   slog.New(slog.NewJSONHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registry: s.reg,
		Ready:    func(context.Context) error { return nil },
		Now:      s.clock.Now,
	})
	s.e.GET("/things/:id", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]string{"id": c.Param("id")}) })
	s.e.POST("/charges", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]string{"status": "succeeded"})
	})
	s.e.POST("/slow-charges", func(c echo.Context) error {
		// Stripe answered after the server could no longer write.
		s.clock.Advance(httpserver.WriteTimeout + time.Second)
		return c.JSON(http.StatusCreated, map[string]string{"status": "succeeded"})
	})
	s.e.GET("/slow-things/:id", func(c echo.Context) error {
		s.clock.Advance(httpserver.SlowRead)
		return c.JSON(http.StatusOK, map[string]string{"id": c.Param("id")})
	})
	admin := s.e.Group("/admin")
	admin.GET("/events/:id", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]any{"payload": "secret"}) })
	return s
}

func (s *testServer) do(req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	s.e.ServeHTTP(rec, req)
	return rec
}

// 23,000 made-up methods once grew the process by 90 MB: labels must come from finite sets.
func TestMetricLabelsAreBounded(t *testing.T) {
	t.Parallel()
	s := newTestServer(t)
	for i := range 300 {
		method := fmt.Sprintf("M%dX", i)
		s.do(httptest.NewRequest(method, fmt.Sprintf("/things/%d", i), nil))
		s.do(httptest.NewRequest(method, fmt.Sprintf("/nope/%d", i), nil))
		s.do(httptest.NewRequest(http.MethodGet, fmt.Sprintf("/nope/%d", i), nil))
		s.do(httptest.NewRequest(http.MethodGet, fmt.Sprintf("/things/%d", i), nil))
	}
	s.do(httptest.NewRequest(http.MethodDelete, "/things/1", nil))

	families, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	methods, routes := map[string]bool{}, map[string]bool{}
	series := 0
	for _, f := range families {
		if f.GetName() != "billing_http_request_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			series++
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "method":
					methods[l.GetValue()] = true
				case "route":
					routes[l.GetValue()] = true
				}
			}
		}
	}
	allowedMethods := map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true, "other": true}
	for m := range methods {
		if !allowedMethods[m] {
			t.Errorf("method label %q", m)
		}
	}
	for _, want := range []string{"other", "GET", "DELETE"} {
		if !methods[want] {
			t.Errorf("no method label %q in %v", want, methods)
		}
	}
	allowedRoutes := map[string]bool{"/things/:id": true, "unmatched": true}
	for r := range routes {
		if !allowedRoutes[r] {
			t.Errorf("route label %q", r)
		}
	}
	if len(routes) != 2 {
		t.Errorf("route labels %v, want both of %v", routes, allowedRoutes)
	}
	// Two routes × three methods (GET, DELETE, other) × a few statuses at most.
	if series > 12 {
		t.Errorf("%d series after 1,200 requests: labels are not bounded", series)
	}
}

func TestDecodeJSONTrailingData(t *testing.T) {
	t.Parallel()
	e := newServer(t, func(context.Context) error { return nil })
	tests := []struct {
		body   string
		status int
	}{
		{`{"name":"x"}}`, 400},
		{`{"name":"x"}]`, 400},
		{`{} x`, 400},
		{`{}{}`, 400},
		{"{}\n", 200},
		{" {\"name\":\"x\"} \r\n\t ", 200},
	}
	for _, tc := range tests {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(tc.body)))
		if rec.Code != tc.status {
			t.Errorf("%q: status %d, want %d (%s)", tc.body, rec.Code, tc.status, rec.Body)
			continue
		}
		if tc.status == 400 && !strings.Contains(rec.Body.String(), `"invalid_json"`) {
			t.Errorf("%q: %s, want invalid_json", tc.body, rec.Body)
		}
	}
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	s := newTestServer(t)
	generated := regexp.MustCompile(`^[0-9a-f]{24}$`)
	tests := []struct {
		name, sent string
		kept       bool
	}{
		{"none", "", false},
		{"safe token", "req-1.A_b", true},
		{"64 characters", strings.Repeat("a", 64), true},
		{"65 characters", strings.Repeat("a", 65), false},
		{"10 KB", strings.Repeat("x", 10_000), false},
		{"space", "a b", false},
		{"markup", "<script>", false},
		{"quote", `a"b`, false},
		{"non-ASCII", "é", false},
	}
	for _, tc := range tests {
		req := httptest.NewRequest(http.MethodGet, "/things/"+strings.ReplaceAll(tc.name, " ", "-"), nil)
		if tc.sent != "" {
			req.Header.Set(echo.HeaderXRequestID, tc.sent)
		}
		got := s.do(req).Header().Get(echo.HeaderXRequestID)
		switch {
		case tc.kept && got != tc.sent:
			t.Errorf("%s: answered id %q, want the client's", tc.name, got)
		case !tc.kept && !generated.MatchString(got):
			t.Errorf("%s: answered id %.80q, want a generated one", tc.name, got)
		}
	}
	lines := s.logs.requests(t)
	if len(lines) != len(tests) {
		t.Fatalf("%d request log lines, want %d", len(lines), len(tests))
	}
	for i, line := range lines {
		rid, _ := line["request_id"].(string)
		if len(rid) == 0 || len(rid) > 64 {
			t.Errorf("%s: logged request id %.80q", tests[i].name, rid)
		}
	}
}

// Quick successful reads are debug lines; writes, refusals, failures and slow reads are info.
func TestRequestLogLevels(t *testing.T) {
	t.Parallel()
	s := newTestServer(t)
	tests := []struct {
		method, path, level string
	}{
		{http.MethodGet, "/things/1", "DEBUG"},
		{http.MethodHead, "/things/1", "INFO"}, // no HEAD route: refused 405
		{http.MethodGet, "/healthz", "DEBUG"},
		{http.MethodPost, "/charges", "INFO"},
		{http.MethodGet, "/slow-things/1", "INFO"},
		{http.MethodGet, "/nope", "INFO"},
		{http.MethodDelete, "/things/1", "INFO"},
	}
	for _, tc := range tests {
		s.do(httptest.NewRequest(tc.method, tc.path, nil))
	}
	lines := s.logs.requests(t)
	if len(lines) != len(tests) {
		t.Fatalf("%d request log lines, want %d: %v", len(lines), len(tests), lines)
	}
	for i, tc := range tests {
		if lines[i]["level"] != tc.level || lines[i]["path"] != tc.path {
			t.Errorf("%s %s: logged %v %v, want %s", tc.method, tc.path, lines[i]["level"], lines[i]["path"], tc.level)
		}
	}
}

func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	s := newTestServer(t)
	for _, path := range []string{"/admin/events/evt_1", "/things/1", "/healthz", "/nope"} {
		rec := s.do(httptest.NewRequest(http.MethodGet, path, nil))
		if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s (%d): X-Content-Type-Options %q", path, rec.Code, got)
		}
		if got := rec.Header().Get("Cache-Control"); got != "no-store" {
			t.Errorf("%s (%d): Cache-Control %q", path, rec.Code, got)
		}
	}
}

// failingWriter is a client that went away: every write fails.
type failingWriter struct {
	header http.Header
	status int
}

func (w *failingWriter) Header() http.Header         { return w.header }
func (w *failingWriter) WriteHeader(status int)      { w.status = status }
func (w *failingWriter) Write(b []byte) (int, error) { return 0, errors.New("write tcp: broken pipe") }

func TestUnwrittenAnswerIsNotLoggedAsSent(t *testing.T) {
	t.Parallel()
	s := newTestServer(t)

	s.do(httptest.NewRequest(http.MethodPost, "/charges", nil))
	s.e.ServeHTTP(&failingWriter{header: http.Header{}}, httptest.NewRequest(http.MethodPost, "/charges", nil))
	s.do(httptest.NewRequest(http.MethodPost, "/slow-charges", nil))

	lines := s.logs.requests(t)
	if len(lines) != 3 {
		t.Fatalf("%d request log lines, want 3: %v", len(lines), lines)
	}
	want := []struct {
		name    string
		level   string
		written bool
	}{
		{"written", "INFO", true},
		{"write error", "ERROR", false},
		{"past the write deadline", "ERROR", false},
	}
	for i, w := range want {
		line := lines[i]
		if line["level"] != w.level || line["written"] != w.written {
			t.Errorf("%s: logged level %v written %v, want %s %v: %v", w.name, line["level"], line["written"], w.level, w.written, line)
		}
		// The status logged is the answer the handler gave, written or not.
		if line["status"] != float64(http.StatusCreated) {
			t.Errorf("%s: logged status %v, want 201", w.name, line["status"])
		}
		if _, hasErr := line["error"]; hasErr == w.written {
			t.Errorf("%s: error attribute present = %v: %v", w.name, hasErr, line)
		}
	}
}

func TestBudgetsAreConsistent(t *testing.T) {
	t.Parallel()
	if httpserver.ReadTimeout+httpserver.OutboundBudget >= httpserver.WriteTimeout {
		t.Errorf("body read (%v) + outbound budget (%v) leave no time to write before %v",
			httpserver.ReadTimeout, httpserver.OutboundBudget, httpserver.WriteTimeout)
	}
	srv := httpserver.NewHTTPServer(":0", http.NotFoundHandler())
	if srv.WriteTimeout != httpserver.WriteTimeout || srv.ReadTimeout != httpserver.ReadTimeout ||
		srv.ReadHeaderTimeout != httpserver.ReadHeaderTimeout || srv.MaxHeaderBytes != httpserver.MaxHeaderBytes {
		t.Errorf("server does not use the budgets: %+v", srv)
	}
}

// A 900 KB header was once accepted; the server now refuses anything over MaxHeaderBytes.
func TestHTTPServerRefusesHugeHeaders(t *testing.T) {
	t.Parallel()
	s := newTestServer(t)
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = httpserver.NewHTTPServer("", s.e)
	ts.Start()
	t.Cleanup(ts.Close)

	get := func(header string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, ts.URL+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Padding", header)
		res, err := ts.Client().Do(req)
		if err != nil {
			t.Fatalf("request with a %d-byte header: %v", len(header), err)
		}
		_ = res.Body.Close()
		return res.StatusCode
	}
	if got := get(strings.Repeat("a", 1000)); got != http.StatusOK {
		t.Errorf("1 KB header: status %d", got)
	}
	if got := get(strings.Repeat("a", 900<<10)); got != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("900 KB header: status %d, want 431", got)
	}
}
