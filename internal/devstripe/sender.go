package devstripe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"billing/internal/stripeevents"
)

// WebhookSender delivers events to a webhook endpoint as Stripe does: each signed with the
// endpoint's secret (Stripe-Signature), one at a time in the order given, and a delivery not
// answered 200 tried again after a backoff, because the service may still be starting (make run
// starts the dev Stripe first).
type WebhookSender struct {
	URL, Secret string
	// Attempts per event (5 when zero); Backoff is the first wait, doubled after each failure
	// (250 ms when zero).
	Attempts int
	Backoff  time.Duration
	Client   *http.Client

	mu sync.Mutex // one delivery at a time: events arrive in Stripe's order
}

// Delivery is what became of one event.
type Delivery struct {
	EventID  string `json:"event_id"`
	Type     string `json:"type"`
	Status   int    `json:"status"` // the last answer's HTTP status (0: no answer)
	Attempts int    `json:"attempts"`
	Error    string `json:"error,omitempty"`
}

// Send delivers the events in order. It stops at the first event that is still not answered 200
// after every attempt (a later event must not overtake it), and returns the deliveries made so far
// with an error naming it.
func (s *WebhookSender) Send(ctx context.Context, events ...[]byte) ([]Delivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sendAll(ctx, 0, events)
}

// SendWithin is Send with each event tried until it is answered 200 or within has passed since
// its first attempt, however many attempts that takes (the waits between them double up to 2 s):
// for events sent at start-up, before the service listens.
func (s *WebhookSender) SendWithin(ctx context.Context, within time.Duration, events ...[]byte) ([]Delivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sendAll(ctx, max(within, time.Nanosecond), events)
}

// sendAll sends events in order; within > 0 gives each that long instead of Attempts.
func (s *WebhookSender) sendAll(ctx context.Context, within time.Duration, events [][]byte) ([]Delivery, error) {
	var out []Delivery
	for _, ev := range events {
		var deadline time.Time
		if within > 0 {
			deadline = time.Now().Add(within)
		}
		d := s.deliver(ctx, ev, deadline)
		out = append(out, d)
		if d.Status != http.StatusOK {
			return out, fmt.Errorf("event %s (%s) not delivered to %s after %d attempts: %s", d.EventID, d.Type, s.URL, d.Attempts, d.Error)
		}
	}
	return out, nil
}

// deliver tries one event: Attempts times, or until deadline when it is set.
func (s *WebhookSender) deliver(ctx context.Context, payload []byte, deadline time.Time) Delivery {
	var head struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	}
	_ = json.Unmarshal(payload, &head)
	d := Delivery{EventID: head.ID, Type: head.Type}
	attempts, wait := s.Attempts, s.Backoff
	if attempts <= 0 {
		attempts = 5
	}
	if wait <= 0 {
		wait = 250 * time.Millisecond
	}
	client := s.Client
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	for d.Attempts < attempts || !deadline.IsZero() {
		d.Attempts++
		d.Status, d.Error = s.post(ctx, client, payload)
		if d.Status == http.StatusOK || (deadline.IsZero() && d.Attempts == attempts) ||
			(!deadline.IsZero() && time.Now().Add(wait).After(deadline)) {
			break
		}
		select {
		case <-ctx.Done():
			d.Error = ctx.Err().Error()
			return d
		case <-time.After(wait): // backoff before a retry, as Stripe spaces its retries
		}
		wait *= 2
		if !deadline.IsZero() {
			wait = min(wait, 2*time.Second)
		}
	}
	return d
}

func (s *WebhookSender) post(ctx context.Context, client *http.Client, payload []byte) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(payload))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	// Signed at delivery, as Stripe signs each attempt anew: a retry is not an old signature.
	req.Header.Set("Stripe-Signature", stripeevents.SignatureHeader(payload, s.Secret, time.Now()))
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Sprintf("answered %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	return resp.StatusCode, ""
}
