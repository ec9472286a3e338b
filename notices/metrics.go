package notices

import "github.com/prometheus/client_golang/prometheus"

// Metrics of notice delivery, registered by the composition root (Collectors). Counted per
// attempt: an attempt whose transaction rolls back counts too.
var Metrics = struct {
	delivered    *prometheus.CounterVec
	sendFailures *prometheus.CounterVec
}{
	delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "billing_notices_delivered_total",
		Help: "Notices handled, by kind and delivery (smtp, log, no_recipient, invalid_recipient, failed).",
	}, []string{"kind", "delivery"}),
	sendFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "billing_notices_send_failures_total",
		Help: "Failed attempts to hand a notice to the mail server, by kind (the job retries).",
	}, []string{"kind"}),
}

// Collectors are the package's metrics, for the service's registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{Metrics.delivered, Metrics.sendFailures}
}
