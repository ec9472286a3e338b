package appevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"billing/internal/testenv"
	"billing/migrations"
)

func TestMain(m *testing.M) {
	testenv.SetMigrator(migrations.ApplyQuietly)
	testenv.Main(m)
}

// answer is a subject's answer in these tests.
type answer struct {
	UserID   string `json:"user_id"`
	Entitled bool   `json:"entitled"`
	Status   string `json:"status"`
}

// tell locks and tells a in a transaction of its own and returns the event (nil: none).
func tell(t *testing.T, db *gorm.DB, tl *Teller, a answer) *Body {
	t.Helper()
	var b *Body
	err := db.Transaction(func(tx *gorm.DB) error {
		l, err := tl.Lock(context.Background(), tx, a.UserID, false, SubjectEntitlement)
		if err != nil {
			return err
		}
		b, err = tl.Tell(context.Background(), tx, l, Change{Type: TypeEntitlementUpdated, Answer: a, WithPrevious: true,
			Baseline: json.RawMessage(`{"user_id":"` + a.UserID + `","entitled":false,"status":"none"}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stored is an app_events row as the tests read it.
type stored struct {
	ID       string          `gorm:"column:id"`
	UserID   string          `gorm:"column:user_id"`
	Sequence int64           `gorm:"column:sequence"`
	Type     string          `gorm:"column:type"`
	Status   string          `gorm:"column:status"`
	Attempts int             `gorm:"column:attempts"`
	Data     json.RawMessage `gorm:"column:data"`
}

func events(t *testing.T, db *gorm.DB, userID string) []stored {
	t.Helper()
	var rows []stored
	if err := db.Raw(`SELECT id, user_id, sequence, type, status, attempts, data FROM app_events WHERE user_id = $1 ORDER BY sequence`,
		userID).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	return rows
}

func TestTellWritesAnEventOnlyForAChange(t *testing.T) {
	db := testenv.DB(t)
	tl := NewTeller(nil)

	if b := tell(t, db, tl, answer{UserID: "u1", Status: "none"}); b != nil {
		t.Fatalf("the baseline answer was told as a change: %+v", b)
	}
	first := tell(t, db, tl, answer{UserID: "u1", Entitled: true, Status: "active"})
	if first == nil || first.Sequence != 1 {
		t.Fatalf("first change: %+v, want sequence 1", first)
	}
	if b := tell(t, db, tl, answer{UserID: "u1", Entitled: true, Status: "active"}); b != nil {
		t.Fatalf("the same answer again was told: %+v", b)
	}
	second := tell(t, db, tl, answer{UserID: "u1", Entitled: false, Status: "past_due"})
	if second == nil || second.Sequence != 2 {
		t.Fatalf("second change: %+v, want sequence 2", second)
	}
	rows := events(t, db, "u1")
	if len(rows) != 2 {
		t.Fatalf("%d events stored, want 2", len(rows))
	}
	var data struct {
		Entitled bool           `json:"entitled"`
		Status   string         `json:"status"`
		Previous map[string]any `json:"previous"`
	}
	if err := json.Unmarshal(rows[1].Data, &data); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"entitled": true, "status": "active"}
	if data.Entitled || data.Status != "past_due" || fmt.Sprint(data.Previous) != fmt.Sprint(want) {
		t.Errorf("second event's data = %s; want the answer with previous %v", rows[1].Data, want)
	}
	if rows[0].ID != first.ID || rows[1].ID != second.ID || rows[0].Status != "pending" {
		t.Errorf("stored %+v, told %s and %s", rows, first.ID, second.ID)
	}
}

func TestTellRolledBackLeavesNoEventAndNoGap(t *testing.T) {
	db := testenv.DB(t)
	tl := NewTeller(nil)
	rollback := errors.New("roll back")
	err := db.Transaction(func(tx *gorm.DB) error {
		l, err := tl.Lock(context.Background(), tx, "u1", false, SubjectEntitlement)
		if err != nil {
			return err
		}
		if _, err := tl.Tell(context.Background(), tx, l, Change{Type: TypeEntitlementUpdated, Answer: answer{UserID: "u1", Entitled: true}}); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	if rows := events(t, db, "u1"); len(rows) != 0 {
		t.Fatalf("a rolled-back change left %d events", len(rows))
	}
	if b := tell(t, db, tl, answer{UserID: "u1", Entitled: true, Status: "active"}); b == nil || b.Sequence != 1 {
		t.Fatalf("after a rollback the next event is %+v, want sequence 1", b)
	}
}

func TestSequenceHasNoGapUnderConcurrentChanges(t *testing.T) {
	db := testenv.DB(t)
	tl := NewTeller(nil)
	const writers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range each {
				err := db.Transaction(func(tx *gorm.DB) error {
					l, err := tl.Lock(context.Background(), tx, "u1", false, SubjectEntitlement)
					if err != nil {
						return err
					}
					// Every answer differs from every other: each is a change.
					_, err = tl.Tell(context.Background(), tx, l, Change{Type: TypeEntitlementUpdated,
						Answer: answer{UserID: "u1", Status: fmt.Sprintf("w%d-%d", w, k)}})
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rows := events(t, db, "u1")
	if len(rows) != writers*each {
		t.Fatalf("%d events, want %d", len(rows), writers*each)
	}
	for k, r := range rows {
		if r.Sequence != int64(k+1) {
			t.Fatalf("event %d has sequence %d: a gap or a repeat", k, r.Sequence)
		}
	}
}

func TestTellNeedsTheLock(t *testing.T) {
	db := testenv.DB(t)
	tl := NewTeller(nil)
	err := db.Transaction(func(tx *gorm.DB) error {
		// A Locked that Lock did not give (its sequence is not the stored one).
		l := &Locked{UserID: "u1", Subject: SubjectEntitlement, lastSequence: 5}
		_, err := tl.Tell(context.Background(), tx, l, Change{Type: TypeEntitlementUpdated, Answer: answer{UserID: "u1", Entitled: true}})
		return err
	})
	if err == nil {
		t.Fatal("Tell wrote an event without Lock's lock")
	}
	if rows := events(t, db, "u1"); len(rows) != 0 {
		t.Fatalf("%d events written without the lock", len(rows))
	}
}

func TestTellPlansTheNextChange(t *testing.T) {
	db := testenv.DB(t)
	tl := NewTeller(nil)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	plan := func(next *time.Time) {
		t.Helper()
		err := db.Transaction(func(tx *gorm.DB) error {
			l, err := tl.Lock(context.Background(), tx, "u1", false, SubjectEntitlement)
			if err != nil {
				return err
			}
			_, err = tl.Tell(context.Background(), tx, l, Change{Type: TypeEntitlementUpdated,
				Answer: answer{UserID: "u1", Entitled: true}, Plan: true, NextChangeAt: next})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	read := func() *time.Time {
		var v *time.Time
		if err := db.Raw(`SELECT next_change_at FROM app_event_users WHERE user_id = 'u1'`).Row().Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	plan(&at)
	if got := read(); got == nil || !got.Equal(at) {
		t.Fatalf("next_change_at = %v, want %v", got, at)
	}
	// The same answer with another plan: no event, the plan moves.
	later := at.Add(time.Hour)
	plan(&later)
	if got := read(); got == nil || !got.Equal(later) {
		t.Fatalf("next_change_at = %v, want %v", got, later)
	}
	plan(nil)
	if got := read(); got != nil {
		t.Fatalf("next_change_at = %v, want none", got)
	}
	if rows := events(t, db, "u1"); len(rows) != 1 {
		t.Fatalf("%d events, want 1 (plans are no news)", len(rows))
	}
}
