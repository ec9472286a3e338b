package webhooks_test

import (
	"context"
	"testing"
	"time"
)

// Prune deletes processed and ignored events older than the cutoff, in batches, and never a
// failed or received one, nor a recent one.
func TestPruneKeepsWhatIsStillNeeded(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	old := time.Now().Add(-100 * 24 * time.Hour)
	recent := time.Now().Add(-time.Hour)
	rows := []struct {
		id     string
		status string
		at     time.Time
		kept   bool
	}{
		{"evt_old_processed_1", "processed", old, false},
		{"evt_old_processed_2", "processed", old, false},
		{"evt_old_processed_3", "processed", old, false},
		{"evt_old_ignored", "ignored", old, false},
		{"evt_old_failed", "failed", old, true},
		{"evt_old_received", "received", old, true},
		{"evt_recent_processed", "processed", recent, true},
		{"evt_recent_ignored", "ignored", recent, true},
	}
	for _, r := range rows {
		if err := h.db.Exec(`INSERT INTO webhook_events (event_id, source, type, livemode, status, payload, received_at)
			VALUES ($1, 'stripe', 'customer.subscription.updated', false, $2, '{}', $3)`, r.id, r.status, r.at).Error; err != nil {
			t.Fatal(err)
		}
	}
	if err := h.db.Exec(`INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error) VALUES ('evt_old_failed', false, 3, 'x')`).Error; err != nil {
		t.Fatal(err)
	}
	// Batches of 2 make the loop run more than once (4 rows to delete).
	n, err := h.inbox.Prune(context.Background(), time.Now().Add(-90*24*time.Hour), 2)
	if err != nil || n != 4 {
		t.Fatalf("Prune = %d, %v; want 4", n, err)
	}
	for _, r := range rows {
		if got := h.count(`SELECT count(*) FROM webhook_events WHERE event_id = $1`, r.id) == 1; got != r.kept {
			t.Errorf("%s (%s): kept=%v, want %v", r.id, r.status, got, r.kept)
		}
	}
	if h.count(`SELECT count(*) FROM webhook_dead_letters`) != 1 {
		t.Error("the dead letter of a failed event was pruned")
	}
	if n, err := h.inbox.Prune(context.Background(), time.Now().Add(-90*24*time.Hour), 2); err != nil || n != 0 {
		t.Errorf("second Prune = %d, %v; want 0", n, err)
	}
}
