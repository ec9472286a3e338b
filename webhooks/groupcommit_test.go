package webhooks_test

import (
	"sync"
	"testing"
	"time"

	"billing/internal/stripeevents"
	"billing/webhooks"
)

// batchOf delivers payloads so that they share one transaction: the inbox's only lane is held
// by a delivery whose handler waits, the payloads queue behind it, and the lane, released, takes
// them all as its next batch. It returns their answers, in order.
func (h *harness) batchOf(payloads ...[]byte) []answer {
	h.t.Helper()
	h.inbox.SetGroupLanes(1)
	g := &holdGate{arrived: make(chan struct{}), release: make(chan struct{})}
	h.hold = g
	blocker := make(chan answer, 1)
	go func() {
		blocker <- h.deliver(stripeevents.Event("evt_lane_holder", blockingType, time.Now(), false, map[string]any{"id": "ch_1", "object": "charge"}, nil))
	}()
	<-g.arrived
	answers := make([]answer, len(payloads))
	var wg sync.WaitGroup
	for k, p := range payloads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[k] = h.deliver(p)
		}()
	}
	// Queued behind the held lane: the condition the batch needs, not a delay.
	deadline := time.Now().Add(10 * time.Second)
	for h.inbox.QueuedApplies() < len(payloads) {
		if time.Now().After(deadline) {
			h.t.Fatalf("%d of %d applies queued behind the held lane", h.inbox.QueuedApplies(), len(payloads))
		}
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	wg.Wait()
	if a := <-blocker; a.Status != 200 || a.Body["status"] != "received" {
		h.t.Fatalf("the lane's holder: %d %v", a.Status, a.Body)
	}
	return answers
}

// appliedOnceAtFirstAttempt checks that each event is stored processed after one attempt and its
// effect applied once.
func (h *harness) appliedOnceAtFirstAttempt(ids ...string) {
	h.t.Helper()
	for _, id := range ids {
		if row, _ := h.event(id); row.Status != "processed" || row.Attempts != 1 {
			h.t.Errorf("%s: %+v, want processed after 1 attempt", id, row)
		}
		if n := h.applied(id); n != 1 {
			h.t.Errorf("%s applied %d times, want 1", id, n)
		}
	}
}

// groupCommits is what the group commit metrics say: the shared transactions committed, the
// events they held, and the events applied again alone.
func (h *harness) groupCommits() (batches uint64, events float64, retries float64) {
	h.t.Helper()
	families, err := h.metrics.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "billing_webhook_group_commit_events":
				batches, events = m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			case "billing_webhook_group_commit_retries_total":
				retries = m.GetCounter().GetValue()
			}
		}
	}
	return batches, events, retries
}

// Deliveries that arrive together are applied in one transaction, one COMMIT, and each is
// answered only once it is committed: processed, applied once, after its first attempt.
func TestGroupCommitAppliesABatchInOneCommit(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t)
	ids := []string{"evt_gc_1", "evt_gc_2", "evt_gc_3"}
	var payloads [][]byte
	for _, id := range ids {
		payloads = append(payloads, subEvent(id, time.Now()))
	}
	for k, a := range h.batchOf(payloads...) {
		if a.Status != 200 || a.Body["status"] != "received" {
			t.Errorf("%s: %d %v", ids[k], a.Status, a.Body)
		}
	}
	h.appliedOnceAtFirstAttempt(ids...)
	if batches, events, retries := h.groupCommits(); batches != 1 || events != 3 || retries != 0 {
		t.Errorf("group commits: %d batches of %v events, %v retries; want 1 of 3, none", batches, events, retries)
	}
}

// One event of a batch that fails rolls the batch back; each event is then applied alone, so
// the failure is handled as it would be alone (here: dead-lettered at once) and the others are
// applied once.
func TestGroupCommitFailureAppliesEachAlone(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t)
	answers := h.batchOf(subEvent("evt_gc_ok1", time.Now()),
		stripeevents.Event("evt_gc_perm", permanentType, time.Now(), false, map[string]any{"id": "dp_1", "object": "dispute"}, nil),
		subEvent("evt_gc_ok2", time.Now()))
	for k, a := range answers {
		if a.Status != 200 || a.Body["status"] != "received" {
			t.Errorf("delivery %d: %d %v", k, a.Status, a.Body)
		}
	}
	h.appliedOnceAtFirstAttempt("evt_gc_ok1", "evt_gc_ok2")
	if row, _ := h.event("evt_gc_perm"); row.Status != "failed" || row.Attempts != 1 {
		t.Errorf("the failing event: %+v, want failed after 1 attempt", row)
	}
	if n := h.count(`SELECT count(*) FROM webhook_dead_letters WHERE event_id = 'evt_gc_perm'`); n != 1 {
		t.Errorf("%d dead letters of the failing event, want 1", n)
	}
	if batches, _, retries := h.groupCommits(); batches != 0 || retries != 3 {
		t.Errorf("group commits: %d batches, %v retries; want none committed, 3 applied again", batches, retries)
	}
}

// A batch whose connection dies before its COMMIT (a process or database gone mid-batch)
// commits nothing: the events applied before the break are applied once, alone, not twice.
func TestGroupCommitLostMidBatchCommitsNothing(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t)
	h.batchOf(subEvent("evt_gc_before", time.Now()),
		stripeevents.Event("evt_gc_killer", killerType, time.Now(), false, map[string]any{"id": "dp_2", "object": "dispute"}, nil),
		subEvent("evt_gc_after", time.Now()))
	h.appliedOnceAtFirstAttempt("evt_gc_before", "evt_gc_after")
	if row, _ := h.event("evt_gc_killer"); row.Status == "processed" {
		t.Errorf("the event whose connection died: %+v, want not processed", row)
	}
	if batches, _, retries := h.groupCommits(); batches != 0 || retries != 3 {
		t.Errorf("group commits: %d batches, %v retries; want none committed, 3 applied again", batches, retries)
	}
}

// A lane never waits on a row locked elsewhere: in a batch the handler's lock fails at once, and
// the event waits alone, in its own transaction, while the lane applies the next delivery.
func TestGroupCommitLaneIsNotHeldByALock(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t, func(c *webhooks.Config) { c.InlineTimeout = 2 * time.Second })
	h.inbox.SetGroupLanes(1)
	if err := h.db.Exec(`INSERT INTO test_effects VALUES ('lock_target', 0)`).Error; err != nil {
		t.Fatal(err)
	}
	sqlDB, err := h.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := sqlDB.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback()
	if _, err := blocker.Exec(`SELECT 1 FROM test_effects WHERE event_id = 'lock_target' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan answer, 1)
	go func() {
		waiting <- h.deliver(stripeevents.Event("evt_gc_locked", lockingType, time.Now(), false, map[string]any{"id": "dp_3", "object": "dispute"}, nil))
	}()
	// The locked event waits on the row in a session of its own (not in the lane: a lane's
	// lock does not wait).
	deadline := time.Now().Add(10 * time.Second)
	for h.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no session waits on the locked row")
		}
		time.Sleep(time.Millisecond)
	}
	// The only lane is free: the next delivery is applied in its request.
	if a := h.deliver(subEvent("evt_gc_free", time.Now())); a.Status != 200 || a.Body["status"] != "received" {
		t.Fatalf("delivery beside the locked one: %d %v", a.Status, a.Body)
	}
	if row, _ := h.event("evt_gc_free"); row.Status != "processed" || row.Attempts != 1 {
		t.Errorf("delivery beside the locked one: %+v, want processed in its request", row)
	}
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	if a := <-waiting; a.Status != 200 || a.Body["status"] != "received" {
		t.Fatalf("the locked delivery: %d %v", a.Status, a.Body)
	}
	if row, _ := h.event("evt_gc_locked"); row.Status != "processed" || row.Attempts != 1 {
		t.Errorf("the locked delivery: %+v, want processed in its request once the lock was gone", row)
	}
}

// Two deliveries of one event in one batch: the batch's rows name the event twice, so the batch
// is rolled back and each delivery is applied alone; the event is stored and applied once, and
// so is the other event of the batch.
func TestGroupCommitOneEventTwiceInABatch(t *testing.T) {
	t.Parallel()
	h := newInlineHarness(t)
	twice := subEvent("evt_gc_twice", time.Now())
	answers := h.batchOf(twice, twice, subEvent("evt_gc_other", time.Now()))
	for k, a := range answers {
		if a.Status != 200 {
			t.Errorf("delivery %d: %d %v", k, a.Status, a.Body)
		}
	}
	h.appliedOnceAtFirstAttempt("evt_gc_twice", "evt_gc_other")
	if batches, _, retries := h.groupCommits(); batches != 0 || retries != 3 {
		t.Errorf("group commits: %d batches, %v retries; want the batch of 3 rolled back and each applied alone", batches, retries)
	}
}
