package webhooks_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"billing/internal/stripeevents"
	"billing/webhooks"
)

// The inline path applies an event before answering: no worker runs in this test, yet the
// effect and the processed status are there when the 200 arrives, and no job was queued.
func TestInlineAppliesBeforeTheAnswer(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t)
	payload := subEvent("evt_inline", time.Now())
	if got := h.deliver(payload); got.Status != 200 || got.Body["status"] != "received" {
		t.Fatalf("deliver: %d %v", got.Status, got.Body)
	}
	row, ok := h.event("evt_inline")
	if !ok || row.Status != "processed" || row.Attempts != 1 || row.FailureReason != nil {
		t.Fatalf("event after the answer: %+v (stored %t), want processed after 1 attempt", row, ok)
	}
	if n := h.applied("evt_inline"); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
	if n := h.count(`SELECT count(*) FROM river_job`); n != 0 {
		t.Errorf("%d jobs queued for an event applied inline, want 0", n)
	}
	if got := h.deliver(payload); got.Status != 200 || got.Body["status"] != "duplicate" {
		t.Errorf("redelivery: %d %v, want duplicate", got.Status, got.Body)
	}
	if n := h.applied("evt_inline"); n != 1 {
		t.Errorf("after a redelivery: effect applied %d times, want 1", n)
	}
}

// A failed inline attempt leaves no effect, counts as the first attempt, and hands the event to
// the queue, which applies it on a later attempt.
func TestInlineFailureFallsBackToTheQueue(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t)
	h.failures.Store(1)
	payload := stripeevents.InvoiceEvent("evt_inline_flaky", failingType, time.Now(), false, stripeevents.Invoice{ID: "in_1", Subscription: "sub_1"})
	if got := h.deliver(payload); got.Status != 200 || got.Body["status"] != "received" {
		t.Fatalf("deliver: %d %v", got.Status, got.Body)
	}
	row, _ := h.event("evt_inline_flaky")
	if row.Status != "received" || row.Attempts != 1 || row.FailureReason == nil || !strings.Contains(*row.FailureReason, "handler failed on purpose") {
		t.Fatalf("event after a failed inline attempt: %+v, want received, 1 attempt, the reason", row)
	}
	if n := h.applied("evt_inline_flaky"); n != 0 {
		t.Fatalf("a failed inline attempt left %d effects", n)
	}
	if n := h.count(`SELECT count(*) FROM river_job WHERE args->>'event_id' = 'evt_inline_flaky' AND state = 'scheduled'`); n != 1 {
		t.Fatalf("%d scheduled jobs for the event, want 1 (retried after the retry delay)", n)
	}
	h.start()
	row = h.waitStatus("evt_inline_flaky", "processed")
	if row.Attempts != 2 || row.FailureReason != nil {
		t.Errorf("after the retry: %+v, want 2 attempts and no reason", row)
	}
	if n := h.applied("evt_inline_flaky"); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}

// An error no retry can mend dead-letters the event in the receive transaction: it is still
// acknowledged and stored, and no job is queued.
func TestInlinePermanentFailureIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t)
	payload := stripeevents.Event("evt_inline_perm", permanentType, time.Now(), false, map[string]any{"id": "dp_1", "object": "dispute"}, nil)
	if got := h.deliver(payload); got.Status != 200 || got.Body["status"] != "received" {
		t.Fatalf("deliver: %d %v", got.Status, got.Body)
	}
	row, _ := h.event("evt_inline_perm")
	if row.Status != "failed" || row.Attempts != 1 {
		t.Errorf("event: %+v, want failed after 1 attempt", row)
	}
	if n := h.count(`SELECT count(*) FROM webhook_dead_letters WHERE event_id = 'evt_inline_perm' AND attempts = 1`); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
	if n := h.count(`SELECT count(*) FROM river_job`); n != 0 {
		t.Errorf("%d jobs queued for a dead letter, want 0", n)
	}
}

// Concurrent deliveries of one event wait for each other on its primary key: one applies it,
// the others answer duplicate, also when the first one's attempt fails and falls back.
func TestInlineConcurrentDeliveriesApplyOnce(t *testing.T) {
	t.Parallel()
	for _, failFirst := range []bool{false, true} {
		h := newInlineHarness(t)
		if failFirst {
			h.failures.Store(1)
		}
		id := "evt_inline_race"
		payload := stripeevents.InvoiceEvent(id, failingType, time.Now(), false, stripeevents.Invoice{ID: "in_1", Subscription: "sub_1"})
		received, _ := h.deliverConcurrently(payload, 16)
		if received != 1 {
			t.Errorf("fail first %t: %d deliveries answered received, want 1", failFirst, received)
		}
		h.start()
		h.waitStatus(id, "processed")
		if got := h.applied(id); got != 1 {
			t.Errorf("fail first %t: effect applied %d times, want 1", failFirst, got)
		}
		if got := h.count(`SELECT count(*) FROM webhook_events`); got != 1 {
			t.Errorf("fail first %t: %d rows, want 1", failFirst, got)
		}
	}
}

// An inline attempt that cannot finish within its budget (here: blocked on a row another
// transaction holds) is rolled back and the event is acknowledged through the queue, as a fresh
// event: the delivery does not wait on the lock, and the worker applies the event once the lock
// is gone.
func TestInlineTimeoutQueuesTheEvent(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t, func(c *webhooks.Config) { c.InlineTimeout = 200 * time.Millisecond })
	id := "evt_inline_slow"
	ctx := context.Background()
	sqlDB, err := h.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback()
	// The handler's INSERT of this key waits for this uncommitted one.
	if _, err := blocker.Exec(`INSERT INTO test_effects VALUES ($1, 0)`, id); err != nil {
		t.Fatal(err)
	}
	if got := h.deliver(subEvent(id, time.Now())); got.Status != 200 || got.Body["status"] != "received" {
		t.Fatalf("deliver: %d %v", got.Status, got.Body)
	}
	row, _ := h.event(id)
	if row.Status != "received" || row.Attempts != 0 || row.FailureReason != nil {
		t.Fatalf("event after the budget ran out: %+v, want received, no attempt counted, no reason", row)
	}
	if n := h.count(`SELECT count(*) FROM river_job WHERE args->>'event_id' = $1 AND state = 'available'`, id); n != 1 {
		t.Fatalf("%d available jobs for the event, want 1", n)
	}
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	h.start()
	if row := h.waitStatus(id, "processed"); row.Attempts != 1 {
		t.Errorf("processed after %d attempts, want 1", row.Attempts)
	}
	if n := h.applied(id); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}

// Inline attempts in flight are bounded: while every slot is taken, a delivery is not applied in
// its request but acknowledged through the queue once its budget has gone by waiting; with a
// slot free again, the next one is applied inline.
func TestInlineAttemptsAreBounded(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t, func(c *webhooks.Config) {
		c.InlineConcurrency = 1
		c.InlineTimeout = 200 * time.Millisecond
	})
	release := h.inbox.TakeInlineSlot()
	if got := h.deliver(subEvent("evt_slot_waiter", time.Now())); got.Status != 200 || got.Body["status"] != "received" {
		t.Fatalf("deliver while the slot is taken: %d %v", got.Status, got.Body)
	}
	if row, _ := h.event("evt_slot_waiter"); row.Status != "received" || row.Attempts != 0 {
		t.Errorf("event delivered while the slot was taken: %+v, want queued (received, no attempt)", row)
	}
	if n := h.applied("evt_slot_waiter"); n != 0 {
		t.Errorf("applied %d times in its request, want 0", n)
	}
	release()
	if got := h.deliver(subEvent("evt_slot_free", time.Now())); got.Status != 200 || got.Body["status"] != "received" {
		t.Fatalf("deliver with the slot free: %d %v", got.Status, got.Body)
	}
	if row, _ := h.event("evt_slot_free"); row.Status != "processed" {
		t.Errorf("event delivered with the slot free: %+v, want processed in its request", row)
	}
	h.start()
	h.waitStatus("evt_slot_waiter", "processed")
	if n := h.applied("evt_slot_waiter"); n != 1 {
		t.Errorf("queued event applied %d times, want 1", n)
	}
}

// A delivery does not wait behind stuck work: while all 16 inline slots are held by transactions
// that do not finish, an unrelated delivery waits for a slot no longer than the slot wait, far
// below the inline budget (a minute here), and is stored and queued for the workers instead.
func TestADeliveryDoesNotWaitBehindStuckSlots(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t, func(c *webhooks.Config) {
		c.InlineTimeout = time.Minute
	})
	g := &holdGate{arrived: make(chan struct{}), release: make(chan struct{})}
	h.hold = g
	go func() {
		for range g.arrived {
		}
	}()
	stuck := make(chan answer, 16)
	for k := range 16 {
		go func() {
			stuck <- h.deliver(stripeevents.Event(fmt.Sprintf("evt_stuck_%02d", k), blockingType, time.Now(), false,
				map[string]any{"id": "ch_1", "object": "charge"}, nil))
		}()
	}
	// Every slot taken by a transaction that waits: the condition, not a delay.
	deadline := time.Now().Add(30 * time.Second)
	for h.inbox.InlineSlotsInUse() < 16 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 16 slots taken", h.inbox.InlineSlotsInUse())
		}
		time.Sleep(time.Millisecond)
	}
	answered := make(chan answer, 1)
	go func() { answered <- h.deliver(subEvent("evt_unrelated", time.Now())) }()
	var got answer
	select {
	case got = <-answered:
	case <-time.After(30 * time.Second):
		// Only a failing test gets here: the delivery waited for a slot as long as the slots were held.
		close(g.release)
		t.Fatal("the unrelated delivery waited behind the stuck slots")
	}
	if h.inbox.InlineSlotsInUse() != 16 {
		t.Fatalf("%d slots taken when the unrelated delivery was answered: it did not meet the stuck work", h.inbox.InlineSlotsInUse())
	}
	if got.Status != 200 || got.Body["status"] != "received" {
		t.Fatalf("unrelated delivery: %d %v", got.Status, got.Body)
	}
	if row, _ := h.event("evt_unrelated"); row.Status != "received" || row.Attempts != 0 {
		t.Errorf("unrelated event %+v, want stored and queued (received, no attempt)", row)
	}
	close(g.release)
	for range 16 {
		if a := <-stuck; a.Status != 200 {
			t.Errorf("a stuck delivery, released: %d %v", a.Status, a.Body)
		}
	}
	h.start()
	h.waitStatus("evt_unrelated", "processed")
	if n := h.applied("evt_unrelated"); n != 1 {
		t.Errorf("queued event applied %d times, want 1", n)
	}
}
