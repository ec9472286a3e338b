package stripeemu

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Handle answers its prefix from the test's state, after the fault layer, and leaves other paths
// alone; the longest prefix wins.
func TestHandleRoutesByPrefix(t *testing.T) {
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"from": "upstream", "path": r.URL.Path})
	})
	srv := newTestServer(t, upstream)
	p := New(t, srv)
	p.Handle("/v1/subscriptions", func(r Request) Answer { return Answer{Status: 200, Body: map[string]any{"from": "subs"}} })
	p.Handle("/v1/subscriptions/special", func(r Request) Answer { return Answer{Status: 201, Body: map[string]any{"from": "special"}} })
	p.InjectFault(http.MethodGet, "/v1/subscriptions", Fault500, 1)

	for _, tc := range []struct {
		path   string
		status int
		want   string
	}{
		{"/v1/subscriptions", 500, "injected"},
		{"/v1/subscriptions", 200, `"subs"`},
		{"/v1/subscriptions/sub_1", 200, `"subs"`},
		{"/v1/subscriptions/special/x", 201, `"special"`},
		{"/v1/subscriptions_other", 200, `"upstream"`},
		{"/v1/customers", 200, `"upstream"`},
	} {
		resp, err := http.Get(p.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("GET %s = %d %s, want %d with %s", tc.path, resp.StatusCode, b, tc.status, tc.want)
		}
	}
}

func newTestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// Chaos faults only the paths it names, at its rate, with the kinds it names; a 429 says when to
// come back; every injected fault is counted by kind.
func TestChaosFaultsMatchingPaths(t *testing.T) {
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"path": r.URL.Path})
	})
	p := New(t, newTestServer(t, upstream))
	p.SetChaos(&Chaos{Prefixes: []string{"/v1/charges"}, Rate: 1, Faults: []Fault{Fault429}, Seed: 1})
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(p.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	for range 3 {
		if code, after := get("/v1/charges/ch_1"); code != http.StatusTooManyRequests || after != "1" {
			t.Fatalf("chaos on /v1/charges: %d Retry-After %q, want 429 and 1", code, after)
		}
	}
	if code, _ := get("/v1/customers"); code != http.StatusOK {
		t.Errorf("a path chaos does not name: %d", code)
	}
	if got := p.Faulted(); got[Fault429] != 3 || len(got) != 1 {
		t.Errorf("faults counted %v, want 3 of 429", got)
	}
	p.SetChaos(&Chaos{Rate: 0.5, Seed: 7})
	kinds := map[int]int{}
	for range 200 {
		resp, err := http.Get(p.URL + "/v1/customers")
		if err != nil {
			kinds[0]++ // a dropped connection
			continue
		}
		resp.Body.Close()
		kinds[resp.StatusCode]++
	}
	if kinds[200] < 60 || kinds[429] == 0 || kinds[500] == 0 || kinds[0] == 0 {
		t.Errorf("answers at rate 0.5 over every kind: %v", kinds)
	}
	p.SetChaos(nil)
	if code, _ := get("/v1/charges/ch_1"); code != http.StatusOK {
		t.Errorf("after SetChaos(nil): %d", code)
	}
}
