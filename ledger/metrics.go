package ledger

import (
	"encoding/json"

	"github.com/prometheus/client_golang/prometheus"

	"billing/internal/apierr"
)

// Outcomes counts the answers of POST /v1/charges and POST …/refunds, by kind (charge, refund)
// and outcome: Stripe's status of the object (succeeded, requires_action, …) or the error code
// answered (card_declined, idempotency_conflict, stripe_unavailable, …). Repeats count too: it is
// what the app was told. Registered by the composition root.
var Outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "billing_ledger_requests_total",
	Help: "Charge and refund requests answered, by kind and outcome (Stripe's status of the object, or the error code).",
}, []string{"kind", "outcome"})

func countOutcome(kind string, r reply) reply {
	outcome := "unknown"
	if r.Err != nil {
		outcome = string(apierr.CodeInternal)
		if e, ok := apierr.As(r.Err); ok {
			outcome = string(e.Code)
		}
	} else {
		var b struct {
			Status string `json:"status"`
		}
		if json.Unmarshal(r.Body, &b) == nil && b.Status != "" {
			outcome = b.Status
		}
	}
	Outcomes.WithLabelValues(kind, outcome).Inc()
	return r
}
