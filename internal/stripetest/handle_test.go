package stripetest

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
