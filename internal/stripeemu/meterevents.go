package stripeemu

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// MeterEvents is Stripe's Billing Meter events, served at POST /v1/billing/meter_events: an
// event is validated as Stripe validates it (event_name, payload[stripe_customer_id], an integer
// payload[value], a timestamp within the past 35 days or up to 5 minutes ahead), and kept by its
// identifier. A second event with an identifier already kept is refused as Stripe refuses it
// (400, "An event already exists with identifier …"), however long ago the first came, until
// Forget. Repeats under the same idempotency key are answered by the proxy's key layer first and
// never reach this: Sends counts what did.
type MeterEvents struct {
	mu       sync.Mutex
	livemode bool
	now      func() time.Time
	byID     map[string]MeterEvent
	order    []string
	sends    map[string]int
}

// MeterEvent is one accepted meter event.
type MeterEvent struct {
	Identifier string
	EventName  string
	Customer   string
	Value      int64
	Timestamp  int64
	// IdempotencyKey is the key of the request that made it.
	IdempotencyKey string
}

// NewMeterEvents serves the meter events of one mode on p.
func NewMeterEvents(p *Proxy, livemode bool) *MeterEvents {
	m := &MeterEvents{livemode: livemode, now: time.Now, byID: map[string]MeterEvent{}, sends: map[string]int{}}
	p.Handle("/v1/billing/meter_events", m.serve)
	return m
}

// Events returns the accepted events in the order they came.
func (m *MeterEvents) Events() []MeterEvent {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]MeterEvent, 0, len(m.order))
	for _, id := range m.order {
		out = append(out, m.byID[id])
	}
	return out
}

// Count is how many events Stripe holds under identifier: 0 or 1, as Stripe deduplicates.
func (m *MeterEvents) Count(identifier string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byID[identifier]; ok {
		return 1
	}
	return 0
}

// Sends is how many create requests with identifier reached Stripe's meter events past the key
// layer, refused repeats included: more than one means the service relied on the identifier's
// deduplication, which Stripe keeps for a limited time only.
func (m *MeterEvents) Sends(identifier string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sends[identifier]
}

// Totals sums the accepted values by customer and event name.
func (m *MeterEvents) Totals() map[[2]string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[[2]string]int64{}
	for _, ev := range m.byID {
		out[[2]string{ev.Customer, ev.EventName}] += ev.Value
	}
	return out
}

// Forget drops every identifier, as Stripe's deduplication window passing would.
func (m *MeterEvents) Forget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.byID, m.order = map[string]MeterEvent{}, nil
}

func (m *MeterEvents) serve(r Request) Answer {
	if r.Method != http.MethodPost || r.Path != "/v1/billing/meter_events" {
		return notFound(r.Path)
	}
	f := r.Form
	ev := MeterEvent{
		Identifier: f.Get("identifier"), EventName: f.Get("event_name"), Customer: f.Get("payload[stripe_customer_id]"),
		IdempotencyKey: r.IdempotencyKey,
	}
	if ev.EventName == "" {
		return invalid("event_name", "Missing required param: event_name.")
	}
	if ev.Customer == "" {
		return invalid("payload", "Missing required param: payload[stripe_customer_id].")
	}
	v, err := strconv.ParseInt(f.Get("payload[value]"), 10, 64)
	if err != nil {
		return invalid("payload", "payload[value] must be an integer.")
	}
	ev.Value = v
	now := m.now()
	ev.Timestamp = now.Unix()
	if ts := f.Get("timestamp"); ts != "" {
		n, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return invalid("timestamp", "Invalid integer: "+ts)
		}
		at := time.Unix(n, 0)
		if at.Before(now.Add(-35*24*time.Hour)) || at.After(now.Add(5*time.Minute)) {
			return invalid("timestamp", "Timestamp must be within the past 35 calendar days or up to 5 minutes in the future.")
		}
		ev.Timestamp = n
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ev.Identifier == "" {
		ev.Identifier = fmt.Sprintf("idmp_%d", len(m.order)+1)
	}
	m.sends[ev.Identifier]++
	if _, ok := m.byID[ev.Identifier]; ok {
		return invalid("identifier", "An event already exists with identifier "+ev.Identifier+".")
	}
	m.byID[ev.Identifier] = ev
	m.order = append(m.order, ev.Identifier)
	return Answer{Status: http.StatusOK, Body: map[string]any{
		"object": "billing.meter_event", "created": now.Unix(), "event_name": ev.EventName, "identifier": ev.Identifier,
		"livemode": m.livemode, "timestamp": ev.Timestamp,
		"payload": map[string]any{"stripe_customer_id": ev.Customer, "value": strconv.FormatInt(ev.Value, 10)},
	}}
}

func invalid(param, msg string) Answer {
	return Answer{Status: http.StatusBadRequest, Body: map[string]any{"error": map[string]any{
		"type": "invalid_request_error", "param": param, "message": msg}}}
}
