package stripetest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Call sends a form-encoded request to the proxy as stripe-go would and decodes the JSON answer:
// the tests of the emulator and of the dev Stripe built on it speak to it this way.
func Call(t TB, p *Proxy, method, path string, form url.Values) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, p.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("sk_test_123", "")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(fmt.Sprintf("%s %s: answer is not JSON: %s", method, path, b))
	}
	return resp.StatusCode, out
}
