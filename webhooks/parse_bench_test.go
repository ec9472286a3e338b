package webhooks

import (
	"encoding/json"
	"testing"
	"time"

	"billing/internal/stripeevents"
)

// BenchmarkReadEvent is the parsing a delivery of a subscription event costs on the inline path,
// from the verified body to what the handler decodes: the duplicate-key verdict and the envelope
// (readEvent), the event the handler gets (what dispatch hands it), and the handler's own decode
// of data.object (a struct of the shape billing decodes). Run it single-threaded and short, it
// counts allocations:
//
//	go test -run '^$' -bench ReadEvent -benchtime 2000x -cpu 1 ./webhooks/
func BenchmarkReadEvent(b *testing.B) {
	body, err := stripeevents.Sample("customer.subscription.updated", "bench", time.Unix(1717200000, 0), false)
	if err != nil {
		b.Fatal(err)
	}
	var handlerObject struct {
		ID       string `json:"id"`
		Customer string `json:"customer"`
		Status   string `json:"status"`
		Items    *struct {
			Data []struct {
				Price struct {
					ID string `json:"id"`
				} `json:"price"`
			} `json:"data"`
		} `json:"items"`
		CurrentPeriodStart int64 `json:"current_period_start"`
		CurrentPeriodEnd   int64 `json:"current_period_end"`
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		ev, err := receivedEvent(body)
		if err != nil {
			b.Fatal(err)
		}
		if err := json.Unmarshal(ev.Object, &handlerObject); err != nil {
			b.Fatal(err)
		}
	}
}

// receivedEvent is the reading of a verified body up to the handler's event, as receive and
// dispatch do it.
func receivedEvent(body []byte) (Event, error) {
	env, _, err := readEvent(body)
	if err != nil {
		return Event{}, err
	}
	ev := storedEvent{EventID: env.ID, Type: env.Type, Livemode: *env.Livemode, APIVersion: env.APIVersion, Payload: body}
	event := eventOf(ev, env)
	ev.event = &event
	return decodeEvent(ev)
}
