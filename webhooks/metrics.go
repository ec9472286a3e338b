package webhooks

import (
	"sync"
	"time"

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
	// batches and batchRetries are group commit's: the events of each batch committed, and the
	// events applied again alone after their batch was rolled back.
	batches      prometheus.Histogram
	batchRetries prometheus.Counter
	// slotWaits counts deliveries queued because no inline slot came free within the slot wait.
	slotWaits prometheus.Counter
	// backlog is exported by RegisterGauges; it lives here so that the counting job reaches it.
	backlog *backlog
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
		batches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "billing_webhook_group_commit_events",
			Help:    "Events applied per shared transaction of inline applies (group commit), one observation per COMMIT of two or more.",
			Buckets: []float64{2, 4, 8, 16, 32, 64},
		}),
		batchRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_webhook_group_commit_retries_total",
			Help: "Events applied again in a transaction of their own after their shared transaction was rolled back (one of its events failed).",
		}),
		slotWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_webhook_inline_slot_waits_total",
			Help: "Handled events stored and queued for the workers because every inline slot stayed taken for the slot wait (100 ms).",
		}),
		backlog: &backlog{},
	}
	if reg != nil {
		reg.MustRegister(m.received, m.rejected, m.processed, m.failures, m.dead, m.lag, m.batches, m.batchRetries, m.slotWaits)
	}
	return m
}

func mode(livemode bool) string {
	if livemode {
		return "live"
	}
	return "test"
}

// backlogInterval is how often River's leader counts the backlog; backlogFresh is how long a
// count is exported. A replica that is not the leader has no count and exports nothing; one that
// lost the leadership stops exporting once its count is older than backlogFresh. The window
// spans several periods so that a busy webhooks queue, which delays the counting job, does not
// hide the gauges exactly when the backlog grows.
const (
	backlogInterval = 30 * time.Second
	backlogFresh    = 5 * time.Minute
)

var (
	deadLettersDesc = prometheus.NewDesc("billing_webhook_dead_letters",
		"Dead-lettered events waiting for an admin. Counted every 30s by the replica that is River's leader; "+
			"other replicas export nothing (or their last count, for up to 5m): aggregate with max().", nil, nil)
	pendingDesc = prometheus.NewDesc("billing_webhook_events_pending",
		"Stored events not yet processed. Counted every 30s by the replica that is River's leader; "+
			"other replicas export nothing (or their last count, for up to 5m): aggregate with max().", nil, nil)
)

// backlog is the last count of the backlog.
type backlog struct {
	mu          sync.Mutex
	deadLetters float64
	pending     float64
	countedAt   time.Time // zero: never counted
}

func (b *backlog) set(deadLetters, pending float64, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.deadLetters, b.pending, b.countedAt = deadLetters, pending, at
}

// backlogCollector exports the last count while it is fresh; it never queries anything.
type backlogCollector struct {
	b   *backlog
	now func() time.Time
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- deadLettersDesc
	ch <- pendingDesc
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	c.b.mu.Lock()
	deadLetters, pending, at := c.b.deadLetters, c.b.pending, c.b.countedAt
	c.b.mu.Unlock()
	if at.IsZero() || c.now().Sub(at) > backlogFresh {
		return
	}
	ch <- prometheus.MustNewConstMetric(deadLettersDesc, prometheus.GaugeValue, deadLetters)
	ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, pending)
}
