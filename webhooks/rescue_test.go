package webhooks_test

import (
	"context"
	"testing"
	"time"

	"billing/internal/stripeevents"
	"billing/webhooks"
)

// An event whose job a dead process had fetched gets a new job as soon as its job has run for a
// few seconds, without waiting for River's rescue; an event whose row a live transaction holds,
// or whose job started just now, is left alone. The rescued event is then applied once.
func TestRescueStuckGivesDeadProcessesEventsANewJob(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, id := range []string{"evt_dead", "evt_live_tx", "evt_just_started"} {
		payload := stripeevents.SubscriptionEvent(id, effectType, time.Now(), false, stripeevents.Subscription{ID: "sub_" + id, Customer: "cus_1", Status: "active"})
		if got := h.deliver(payload); got.Body["status"] != "received" {
			t.Fatalf("%s: %v", id, got.Body)
		}
	}
	// What a fetch by a process that then died leaves behind: the job running since a while.
	markRunning := func(id string, since time.Duration) {
		t.Helper()
		if err := h.db.Exec(`UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - make_interval(secs => $1),
			attempted_by = ARRAY['dead-client'] WHERE kind = $2 AND args->>'event_id' = $3`,
			since.Seconds(), webhooks.JobKindProcessEvent, id).Error; err != nil {
			t.Fatal(err)
		}
	}
	markRunning("evt_dead", time.Minute)
	markRunning("evt_live_tx", time.Minute)
	markRunning("evt_just_started", time.Second)

	// A live processing transaction holds its event's row.
	tx := h.db.Begin()
	if err := tx.Exec(`SELECT 1 FROM webhook_events WHERE event_id = 'evt_live_tx' FOR UPDATE`).Error; err != nil {
		t.Fatal(err)
	}
	n, err := h.inbox.RescueStuck(context.Background(), 5*time.Second)
	tx.Rollback()
	if err != nil || n != 1 {
		t.Fatalf("RescueStuck = %d, %v; want 1", n, err)
	}
	fresh := func(id string) int {
		return h.count(`SELECT count(*) FROM river_job WHERE kind = $1 AND args->>'event_id' = $2 AND state = 'available'`, webhooks.JobKindProcessEvent, id)
	}
	if fresh("evt_dead") != 1 || fresh("evt_live_tx") != 0 || fresh("evt_just_started") != 0 {
		t.Errorf("new jobs: dead %d, live tx %d, just started %d; want 1, 0, 0", fresh("evt_dead"), fresh("evt_live_tx"), fresh("evt_just_started"))
	}
	// The transaction is gone now: its event counts as stuck too. Events that have a live job
	// are left alone from then on.
	if n, err := h.inbox.RescueStuck(context.Background(), 5*time.Second); err != nil || n != 1 || fresh("evt_live_tx") != 1 {
		t.Errorf("second round = %d, %v; want 1 (evt_live_tx)", n, err)
	}
	if n, err := h.inbox.RescueStuck(context.Background(), 5*time.Second); err != nil || n != 0 {
		t.Errorf("third round = %d, %v; want 0", n, err)
	}

	h.start()
	h.waitStatus("evt_dead", "processed")
	if got := h.applied("evt_dead"); got != 1 {
		t.Errorf("evt_dead applied %d times", got)
	}
}

// An event that kills its process every time is dead-lettered after worker.max_attempts (3 in
// the harness), not rescued forever.
func TestRescueStuckDeadLettersAPoisonEvent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	payload := stripeevents.SubscriptionEvent("evt_poison", effectType, time.Now(), false, stripeevents.Subscription{ID: "sub_p", Customer: "cus_1", Status: "active"})
	h.deliver(payload)
	for round := 1; round <= 3; round++ {
		// The live job of the event is fetched by a process that dies.
		if err := h.db.Exec(`UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '1 minute'
			WHERE kind = $1 AND args->>'event_id' = 'evt_poison' AND state = 'available'`, webhooks.JobKindProcessEvent).Error; err != nil {
			t.Fatal(err)
		}
		if n, err := h.inbox.RescueStuck(context.Background(), 5*time.Second); err != nil || n != 1 {
			t.Fatalf("round %d: RescueStuck = %d, %v", round, n, err)
		}
		ev, _ := h.event("evt_poison")
		if ev.Attempts != round {
			t.Errorf("round %d: attempts %d", round, ev.Attempts)
		}
	}
	ev, _ := h.event("evt_poison")
	if ev.Status != "failed" || h.count(`SELECT count(*) FROM webhook_dead_letters WHERE event_id = 'evt_poison'`) != 1 {
		t.Errorf("after 3 dead attempts: status %s, want failed with a dead letter", ev.Status)
	}
}
