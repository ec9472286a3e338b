package usage

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the usage service's: what the app was told, what reached Stripe, what did not,
// and how many records are in each state now (read from the database at each scrape).
type metrics struct {
	requests *prometheus.CounterVec
	reported prometheus.Counter
	failures *prometheus.CounterVec
	records  *recordsCollector
}

func newMetrics(s *Service) *metrics {
	return &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_usage_requests_total",
			Help: "POST /v1/customers/{user_id}/usage answers, by outcome (accepted, repeat, or the error code).",
		}, []string{"outcome"}),
		reported: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_usage_reported_total",
			Help: "Usage records marked reported: Stripe acknowledged their meter event.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_usage_report_failures_total",
			Help: "Attempts at reporting a usage record that did not mark it reported, by reason (rate_limited, unavailable, refused, needs_review, error).",
		}, []string{"reason"}),
		records: &recordsCollector{s: s, desc: prometheus.NewDesc("billing_usage_records",
			"Usage records of the service's mode not acknowledged by Stripe, by status (pending; needs_review: past the window, waiting for an operator).",
			[]string{"status"}, nil)},
	}
}

func (m *metrics) register(r prometheus.Registerer) {
	r.MustRegister(m.requests, m.reported, m.failures, m.records)
}

// recordsCollector counts the records by status when scraped.
type recordsCollector struct {
	s    *Service
	desc *prometheus.Desc
}

func (c *recordsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *recordsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Only the states that drain (their partial indexes keep the count cheap); reported and
	// refused are the counters'.
	counts := map[string]float64{statePending: 0, stateNeedsReview: 0}
	var rows []struct {
		Status string
		N      int64
	}
	if err := c.s.db.WithContext(ctx).Raw(`SELECT status, count(*) AS n FROM usage_records
		WHERE livemode = $1 AND status IN ($2, $3) GROUP BY status`, c.s.livemode, statePending, stateNeedsReview).Scan(&rows).Error; err != nil {
		// A scrape never fails for it: the gauges are left out until the database answers.
		return
	}
	for _, r := range rows {
		counts[r.Status] = float64(r.N)
	}
	for status, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, n, status)
	}
}
