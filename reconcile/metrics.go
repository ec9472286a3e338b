package reconcile

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	drift   *prometheus.CounterVec
	objects prometheus.Counter
	// catalogObjects: products and prices compared.
	catalogObjects prometheus.Counter
	retries        prometheus.Counter
	lastSuccess    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_reconcile_drift_total",
			Help: "Fields in which the local state differed from Stripe, found by reconcile runs (dry runs included), by field.",
		}, []string{"field"}),
		objects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_reconcile_objects_total",
			Help: "Subscriptions listed from Stripe and compared by reconcile runs.",
		}),
		catalogObjects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_reconcile_catalog_objects_total",
			Help: "Products and prices read from Stripe and compared by reconcile runs.",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_reconcile_stripe_retries_total",
			Help: "Reads from Stripe that reconcile runs tried again (429, 5xx, no answer).",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_reconcile_last_success_timestamp_seconds",
			Help: "When the last reconcile run (not a dry run) of the service's mode went through to the end, as a Unix time; 0 when none is known.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.drift, m.objects, m.catalogObjects, m.retries, m.lastSuccess)
	}
	return m
}
