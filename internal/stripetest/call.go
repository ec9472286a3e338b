// Package stripetest holds what only tests use of the Stripe emulator (internal/stripeemu):
// nothing a program links. The emulator itself is shared with the dev Stripe.
package stripetest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// Call sends a form-encoded request to the emulator at baseURL as stripe-go would and decodes
// the JSON answer: the tests of the emulator and of the dev Stripe built on it speak to it this
// way.
func Call(t testing.TB, baseURL, method, path string, form url.Values) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, baseURL+path, strings.NewReader(form.Encode()))
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
		t.Fatalf("%s %s: answer is not JSON: %s", method, path, b)
	}
	return resp.StatusCode, out
}
