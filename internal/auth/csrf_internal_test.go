package auth

import (
	"testing"
	"time"
)

// A token is valid for its admin token only, from its issue (give or take the replicas' clock
// skew) until CSRFLifetime later.
func TestCSRFTokenLifetime(t *testing.T) {
	t.Parallel()
	issued := time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)
	tok := csrfToken("admin-1", issued)
	for _, tc := range []struct {
		name       string
		credential string
		now        time.Time
		want       bool
	}{
		{"at once", "admin-1", issued, true},
		{"just before it expires", "admin-1", issued.Add(CSRFLifetime), true},
		{"expired", "admin-1", issued.Add(CSRFLifetime + time.Second), false},
		{"issued by a replica slightly ahead", "admin-1", issued.Add(-30 * time.Second), true},
		{"issued in the future", "admin-1", issued.Add(-2 * time.Minute), false},
		{"another admin token", "admin-2", issued, false},
	} {
		if got := csrfValid(tc.credential, tok, tc.now); got != tc.want {
			t.Errorf("%s: valid = %v, want %v", tc.name, got, tc.want)
		}
	}
	// The issue time is under the MAC: moving it forward breaks the token.
	forged := csrfToken("admin-1", issued.Add(time.Hour))
	if csrfValid("admin-1", forged[:len(forged)-43]+tok[len(tok)-43:], issued.Add(time.Hour)) {
		t.Error("a token with a moved issue time is valid")
	}
}
