package webhooks

import "github.com/prometheus/client_golang/prometheus"

// bodyBudgetGauges show the byte budget of unverified delivery bodies: how much of it the
// deliveries being read hold, and its size. A budget often full means deliveries are refused
// 503 busy (billing_webhook_rejected_total{code="busy"}): slow or hostile uploads, or a budget
// too small for the traffic.
func (i *Inbox) bodyBudgetGauges() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "billing_webhook_unverified_body_bytes",
			Help: "Bytes of webhook delivery bodies reserved by the deliveries being read and verified.",
		}, func() float64 { return float64(i.bodies.InUse()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "billing_webhook_unverified_body_budget_bytes",
			Help: "The byte budget of webhook delivery bodies being read and verified (webhooks.body_budget_mib).",
		}, func() float64 { return float64(i.bodies.Size()) }),
	}
}
