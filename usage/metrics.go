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
	records  *prometheus.GaugeVec
}

func newMetrics() *metrics {
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
		records: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "billing_usage_records",
			Help: "Usage records of the service's mode not acknowledged by Stripe, by status (pending; needs_review: past the window, waiting for an operator); counted every 30 s by each replica's reporter.",
		}, []string{"status"}),
	}
}

func (m *metrics) register(r prometheus.Registerer) {
	r.MustRegister(m.requests, m.reported, m.failures, m.records)
}

// countInterval is how often the reporter counts the records that drain: a scrape never queries
// the database.
const countInterval = 30 * time.Second

// count sets the records gauge from the database.
func (s *Service) count(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Only the states that drain (their partial indexes keep the count cheap); reported and
	// refused are the counters'.
	counts := map[string]float64{statePending: 0, stateNeedsReview: 0}
	var rows []struct {
		Status string
		N      int64
	}
	if err := s.db.WithContext(ctx).Raw(`SELECT status, count(*) AS n FROM usage_records
		WHERE livemode = $1 AND status IN ($2, $3) GROUP BY status`, s.livemode, statePending, stateNeedsReview).Scan(&rows).Error; err != nil {
		s.log.WarnContext(ctx, "count usage records", "error", err)
		return
	}
	for _, r := range rows {
		counts[r.Status] = float64(r.N)
	}
	for status, n := range counts {
		s.metrics.records.WithLabelValues(status).Set(n)
	}
}
