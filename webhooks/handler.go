package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"gorm.io/gorm"
)

// PinnedAPIVersion is the Stripe API version this build speaks (stripe-go v79). Events of any
// other version are stored and dead-lettered, never guessed at.
const PinnedAPIVersion = "2024-06-20"

// Event is a verified, stored Stripe event as a handler sees it.
type Event struct {
	ID         string
	Type       string
	Livemode   bool
	APIVersion string
	// Created is the event's own creation time (Stripe's clock, second precision): the basis of
	// ordering guards.
	Created time.Time
	// Payload is the whole event as received.
	Payload json.RawMessage
	// Object is data.object; PreviousAttributes is data.previous_attributes (may be empty).
	Object             json.RawMessage
	PreviousAttributes json.RawMessage
}

// Handler applies one event's effects inside tx, the same transaction that marks the event
// processed. It must not commit, and must not call out of the process: anything to do later
// (an email) is a job inserted in tx. A returned error rolls everything back and the event is
// retried; wrap it with Permanent when a retry can never succeed.
type Handler interface {
	HandleEvent(ctx context.Context, tx *gorm.DB, ev Event) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx *gorm.DB, ev Event) error

func (f HandlerFunc) HandleEvent(ctx context.Context, tx *gorm.DB, ev Event) error {
	return f(ctx, tx, ev)
}

// Registry maps event types to their handlers. A type with a handler is "handled"; every other
// verified event is stored as ignored. Domain packages register into it at start-up, before the
// receiver and the workers run, so webhooks never imports them.
type Registry struct {
	mu       sync.RWMutex
	handlers map[string]Handler
}

func NewRegistry() *Registry { return &Registry{handlers: map[string]Handler{}} }

// Register sets the handler of an event type; registering a type twice is a wiring bug.
func (r *Registry) Register(eventType string, h Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.handlers[eventType]; dup {
		panic(fmt.Sprintf("webhooks: handler for %q registered twice", eventType))
	}
	r.handlers[eventType] = h
}

// Lookup returns the handler of an event type.
func (r *Registry) Lookup(eventType string) (Handler, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	h, ok := r.handlers[eventType]
	return h, ok
}

// Types lists the handled types, sorted.
func (r *Registry) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.handlers))
	for t := range r.handlers {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// permanentError marks a failure that no retry can fix (a malformed object): the event is
// dead-lettered at once instead of burning its attempts. reason, when set, is a stable
// snake_case word that leads the event's failure_reason and labels the dead-letter metric.
type permanentError struct {
	reason string
	err    error
}

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// PermanentReason marks err as permanent with a stable reason, e.g. FailureLivemodeMismatch.
func PermanentReason(reason string, err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{reason: reason, err: err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// failureReason is the stable reason of a permanent error ("" when it has none).
func failureReason(err error) string {
	var p *permanentError
	if errors.As(err, &p) {
		return p.reason
	}
	return ""
}

// FailureLivemodeMismatch is the failure reason of an event that names an object of the other
// mode (a test-mode event and a live subscription or customer): dead-lettered, never applied.
const FailureLivemodeMismatch = "livemode_mismatch"

// DecodeStored builds the Event a handler receives from a stored row of the log, as processing
// does: for replays of the log outside the inbox (`billing verify`).
func DecodeStored(eventID, eventType string, livemode bool, apiVersion string, payload []byte) (Event, error) {
	v := apiVersion
	return decodeEvent(storedEvent{EventID: eventID, Type: eventType, Livemode: livemode, APIVersion: &v, Payload: payload})
}
