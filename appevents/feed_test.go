package appevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"

	"billing/internal/testenv"
)

// TestFeedPlacesAnEventThatCommitsLate is the outbox feed's classic hole: an event numbered
// first commits after one numbered later was read. A reader paging by the last id must still
// get it.
func TestFeedPlacesAnEventThatCommitsLate(t *testing.T) {
	db := testenv.DB(t)
	tl := NewTeller(nil)
	ctx := context.Background()

	late := db.Begin()
	l, err := tl.Lock(ctx, late, "slow", false, SubjectEntitlement)
	if err != nil {
		t.Fatal(err)
	}
	lateEv, err := tl.Tell(ctx, late, l, Change{Type: TypeEntitlementUpdated, Answer: answer{UserID: "slow", Entitled: true}})
	if err != nil {
		t.Fatal(err)
	}
	early := tell(t, db, tl, answer{UserID: "fast", Entitled: true, Status: "active"})

	p, err := Feed(ctx, db, false, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Events) != 1 || p.Events[0].ID != early.ID {
		t.Fatalf("first page = %+v, want only the committed event %s", p.Events, early.ID)
	}
	if err := late.Commit().Error; err != nil {
		t.Fatal(err)
	}
	p, err = Feed(ctx, db, false, early.ID, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Events) != 1 || p.Events[0].ID != lateEv.ID {
		t.Fatalf("page after %s = %+v, want the event that committed late (%s)", early.ID, p.Events, lateEv.ID)
	}
}

func TestFeedRefusesAnUnknownCursorAndKeepsModesApart(t *testing.T) {
	db := testenv.DB(t)
	tl := NewTeller(nil)
	ev := tell(t, db, tl, answer{UserID: "u1", Entitled: true})
	if _, err := Feed(context.Background(), db, false, "aevt_nothing", 10); !errors.Is(err, ErrUnknownCursor) {
		t.Fatalf("unknown cursor: %v, want ErrUnknownCursor", err)
	}
	if _, err := Feed(context.Background(), db, true, ev.ID, 10); !errors.Is(err, ErrUnknownCursor) {
		t.Fatalf("a test-mode id as a live cursor: %v, want ErrUnknownCursor", err)
	}
	p, err := Feed(context.Background(), db, true, "", 10)
	if err != nil || len(p.Events) != 0 {
		t.Fatalf("live feed = %+v, %v; want empty (the event is test mode's)", p, err)
	}
}

// TestFeedUnderConcurrentWritersSeesEveryEventOnce writes from many transactions at once, some
// held open while others commit, while a reader pages by the last id it got: it must see every
// event exactly once, each user's in sequence order.
func TestFeedUnderConcurrentWritersSeesEveryEventOnce(t *testing.T) {
	db := testenv.DB(t)
	tl := NewTeller(nil)
	ctx := context.Background()
	const writers, each, users = 8, 60, 12
	var written atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range each {
				user := fmt.Sprintf("u%d", (w*each+k)%users)
				err := db.Transaction(func(tx *gorm.DB) error {
					l, err := tl.Lock(ctx, tx, user, false, SubjectEntitlement)
					if err != nil {
						return err
					}
					if _, err := tl.Tell(ctx, tx, l, Change{Type: TypeEntitlementUpdated,
						Answer: answer{UserID: user, Status: fmt.Sprintf("w%d-%d", w, k)}}); err != nil {
						return err
					}
					// Other work after the event's number was taken: commits interleave.
					return tx.Exec(`SELECT pg_sleep(0.001 * $1)`, k%3).Error
				})
				if err != nil {
					errs <- err
					return
				}
				written.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	seen := map[string]bool{}
	lastSeq := map[string]int64{}
	after := ""
	read := func() (int, error) {
		p, err := Feed(ctx, db, false, after, 37)
		if err != nil {
			return 0, err
		}
		for _, e := range p.Events {
			if seen[e.ID] {
				return 0, fmt.Errorf("event %s seen twice", e.ID)
			}
			seen[e.ID] = true
			if e.Sequence != lastSeq[e.UserID]+1 {
				return 0, fmt.Errorf("user %s: sequence %d after %d", e.UserID, e.Sequence, lastSeq[e.UserID])
			}
			lastSeq[e.UserID] = e.Sequence
			after = e.ID
		}
		return len(p.Events), nil
	}
	finished := false
	for !finished {
		select {
		case <-done:
			finished = true
		default:
		}
		// After the writers are done, one more read drains what is left.
		for {
			n, err := read()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if int64(len(seen)) != written.Load() || len(seen) != writers*each {
		t.Fatalf("the reader saw %d events of %d written", len(seen), written.Load())
	}
}
