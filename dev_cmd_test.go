package main

import (
	"bytes"
	"strings"
	"testing"
)

// A portal URL the service redirected to names its session; wrong arguments are usage errors
// (exit 2) that say what is wrong, before any call to the dev Stripe.
func TestDevCommandArguments(t *testing.T) {
	for in, want := range map[string]string{
		"http://localhost:12111/dev-portal/bps_123":      "bps_123",
		"http://localhost:12111/dev-portal/bps_123/?x=1": "bps_123",
		"bps_456": "bps_456",
		"https://billing.stripe.com/p/session/test_abc": "https://billing.stripe.com/p/session/test_abc",
	} {
		if got := portalSessionID(in); got != want {
			t.Errorf("portalSessionID(%q) = %q, want %q", in, got, want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"portal", "apply"}, "portal session (bps_… or its URL) is missing"},
		{[]string{"portal", "apply", "bps_1", "--cancel", "--quantity", "3"}, "not both"},
		{[]string{"checkout", "complete"}, "session id (cs_…) is missing"},
		{[]string{"advance"}, "--days must be above 0"},
		{[]string{"rewind"}, `unknown subcommand "rewind"`},
	} {
		var out, errOut bytes.Buffer
		code := devCommandIn(t.TempDir(), tc.args, &out, &errOut)
		if code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("billing dev %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, errOut.String(), exitUsage, tc.want)
		}
	}
}
