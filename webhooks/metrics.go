package webhooks

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of the inbox. Labels are bounded: event types are Stripe's finite list (an unverified
// request never reaches a type label), modes are two, results a handful.
type Metrics struct {
	received  *prometheus.CounterVec
	rejected  *prometheus.CounterVec
	processed *prometheus.CounterVec
	failures  *prometheus.CounterVec
	dead      *prometheus.CounterVec
	lag       *prometheus.HistogramVec
}

// NewMetrics registers the inbox's metrics with reg (nil: unregistered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_webhook_events_received_total",
			Help: "Verified webhook deliveries by event type, mode and result (received, duplicate, ignored, dead_lettered).",
		}, []string{"type", "mode", "result"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_webhook_deliveries_rejected_total",
			Help: "Webhook deliveries rejected before storage, by reason (the error code answered).",
		}, []string{"reason"}),
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_webhook_events_processed_total",
			Help: "Events whose effects were applied and committed, by type.",
		}, []string{"type"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_webhook_processing_failures_total",
			Help: "Failed processing attempts, by type.",
		}, []string{"type"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_webhook_events_dead_lettered_total",
			Help: "Events moved to the dead-letter table, by type and reason.",
		}, []string{"type", "reason"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "billing_webhook_processing_lag_seconds",
			Help:    "Time from receipt to the committed processing of an event.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
		}, []string{"type"}),
	}
	if reg != nil {
		reg.MustRegister(m.received, m.rejected, m.processed, m.failures, m.dead, m.lag)
	}
	return m
}

func mode(livemode bool) string {
	if livemode {
		return "live"
	}
	return "test"
}
