package ledger

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Each answer counts under its outcome (other tests run in parallel, so only growth is checked).
func TestOutcomesAreCounted(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u_metrics")
	ok := testutil.ToFloat64(Outcomes.WithLabelValues("charge", "succeeded"))
	conflict := testutil.ToFloat64(Outcomes.WithLabelValues("charge", "idempotency_conflict"))
	v.mustCharge("o_metrics", "u_metrics", 100)
	expectError(t, v.charge("o_metrics", "u_metrics", 101, "usd"), http.StatusConflict, "idempotency_conflict")
	if got := testutil.ToFloat64(Outcomes.WithLabelValues("charge", "succeeded")); got < ok+1 {
		t.Errorf("succeeded: %v → %v", ok, got)
	}
	if got := testutil.ToFloat64(Outcomes.WithLabelValues("charge", "idempotency_conflict")); got < conflict+1 {
		t.Errorf("idempotency_conflict: %v → %v", conflict, got)
	}
}
