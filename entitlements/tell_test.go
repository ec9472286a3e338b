package entitlements

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	"billing/appevents"
	"billing/billing"
)

// withAppEvents gives the service a teller (no push) on the test's clock.
func withAppEvents(d *Deps, _ *billing.Deps) { d.AppEvents = appevents.NewTeller(d.Now) }

// appEvent is an entitlement.updated as stored.
type appEvent struct {
	Sequence int64
	Data     struct {
		Entitlement
		Previous map[string]any `json:"previous"`
	}
	NextChangeAt *time.Time
}

func (e *env) appEvents(t *testing.T, userID string) []appEvent {
	t.Helper()
	var rows []struct {
		Sequence int64  `gorm:"column:sequence"`
		Data     []byte `gorm:"column:data"`
		Type     string `gorm:"column:type"`
	}
	if err := e.db.Raw(`SELECT sequence, data, type FROM app_events WHERE user_id = $1 ORDER BY sequence`, userID).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := make([]appEvent, len(rows))
	for k, r := range rows {
		if r.Type != appevents.TypeEntitlementUpdated {
			t.Fatalf("event %d is %s", r.Sequence, r.Type)
		}
		out[k].Sequence = r.Sequence
		if err := json.Unmarshal(r.Data, &out[k].Data); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func (e *env) nextChange(t *testing.T, userID string) *time.Time {
	t.Helper()
	var at *time.Time
	if err := e.db.Raw(`SELECT next_change_at FROM app_event_users WHERE user_id = $1`, userID).Row().Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

func TestEntitlementEventPerChangeAndNoneForADuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withAppEvents)
	e.link(t, "u1", "cus_1", "u1@example.com")
	ev := created("e1", 1, s1)
	e.mustHandle(t, ev)
	got := e.appEvents(t, "u1")
	if len(got) != 1 || !got[0].Data.Entitled || got[0].Data.Status != billing.StatusActive {
		t.Fatalf("after the subscription started: %+v, want one event saying entitled, active", got)
	}
	// What GET answers right after the change is the event's data.
	want, err := e.svc.Entitlement(context.Background(), "u1")
	if err != nil {
		t.Fatal(err)
	}
	gotJSON, _ := json.Marshal(got[0].Data.Entitlement)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("event data %s, GET answers %s", gotJSON, wantJSON)
	}
	if got[0].Data.Previous["entitled"] != false || got[0].Data.Previous["status"] != billing.StatusNone {
		t.Errorf("previous = %v, want entitled false and status none", got[0].Data.Previous)
	}

	// The same event again (a redelivery, a replay), and an update that changes nothing the
	// answer shows: no news.
	e.mustHandle(t, ev, updated("e2", 2, s1))
	if n := len(e.appEvents(t, "u1")); n != 1 {
		t.Fatalf("%d events after a duplicate and a no-op update, want 1", n)
	}

	e.mustHandle(t, updated("e3", 3, s1.With(billing.StatusPastDue)))
	got = e.appEvents(t, "u1")
	if len(got) != 2 || got[1].Sequence != 2 || got[1].Data.Status != billing.StatusPastDue || !got[1].Data.OnHold {
		t.Fatalf("after past_due: %+v, want event 2 on hold", got)
	}
	if _, ok := got[1].Data.Previous["entitled"]; ok {
		t.Errorf("previous %v names entitled, which did not change", got[1].Data.Previous)
	}
	if got[1].Data.Previous["status"] != billing.StatusActive || got[1].Data.Previous["on_hold"] != false {
		t.Errorf("previous = %v, want status active and on_hold false", got[1].Data.Previous)
	}
}

func TestEntitlementEventRolledBackWithItsChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withAppEvents)
	e.link(t, "u1", "cus_1", "u1@example.com")
	h, _ := e.reg.Lookup(billing.EventSubscriptionCreated)
	err := e.db.Transaction(func(tx *gorm.DB) error {
		if err := h.HandleEvent(context.Background(), tx, created("e1", 1, s1)); err != nil {
			return err
		}
		return fmt.Errorf("the commit fails")
	})
	if err == nil {
		t.Fatal("transaction committed")
	}
	if n := len(e.appEvents(t, "u1")); n != 0 {
		t.Fatalf("%d events for a change rolled back", n)
	}
}

func TestEntitlementChangedByTimeAloneIsPlannedAndTold(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withAppEvents)
	e.link(t, "u1", "cus_1", "u1@example.com")
	e.mustHandle(t, created("e1", 1, s1))
	end := at(30 * 86400)
	plan := e.nextChange(t, "u1")
	want := end.Add(e.svc.policy.PeriodGrace)
	if plan == nil || !plan.Equal(want) {
		t.Fatalf("planned change at %v, want the period's end plus the grace (%v)", plan, want)
	}

	told := appevents.New(appevents.Deps{DB: e.db, Now: e.clock.Now})
	told.SetRecheck(e.svc.TellUser)
	// Before the moment nothing is due.
	e.clock.Set(want.Add(-time.Second))
	if n, err := told.TellDue(context.Background()); err != nil || n != 0 {
		t.Fatalf("TellDue before the moment: %d, %v", n, err)
	}
	e.clock.Set(want)
	if n, err := told.TellDue(context.Background()); err != nil || n != 1 {
		t.Fatalf("TellDue at the moment: %d, %v", n, err)
	}
	got := e.appEvents(t, "u1")
	if len(got) != 2 || got[1].Data.Entitled || got[1].Data.UnconfirmedSince == nil {
		t.Fatalf("after the grace ended with no renewal: %+v, want event 2 not entitled, unconfirmed", got)
	}
	if got[1].Data.Previous["entitled"] != true {
		t.Errorf("previous = %v, want entitled true", got[1].Data.Previous)
	}
	if p := e.nextChange(t, "u1"); p != nil {
		t.Errorf("a plan is left after the last change: %v", p)
	}
	// Swept again: no news.
	if _, err := told.TellDue(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(e.appEvents(t, "u1")); n != 2 {
		t.Fatalf("%d events after a second sweep, want 2", n)
	}

	// A renewal re-plans: the new period's end.
	renewed := s1
	renewed.PeriodStart, renewed.PeriodEnd = 30*86400, 60*86400
	e.mustHandle(t, updated("e2", 30*86400+60, renewed))
	got = e.appEvents(t, "u1")
	if len(got) != 3 || !got[2].Data.Entitled {
		t.Fatalf("after the renewal: %+v, want event 3 entitled", got)
	}
	if p := e.nextChange(t, "u1"); p == nil || !p.Equal(at(60*86400).Add(e.svc.policy.PeriodGrace)) {
		t.Errorf("after the renewal the plan is %v", p)
	}
}

func TestEntitlementEventWhenACancelAtPeriodEndComes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withAppEvents)
	e.link(t, "u1", "cus_1", "u1@example.com")
	cancels := s1
	cancels.CancelAtPeriodEnd = true
	e.mustHandle(t, created("e1", 1, cancels))
	// Access ends at the period's end, without any event: that is the plan.
	if p := e.nextChange(t, "u1"); p == nil || !p.Equal(at(30*86400)) {
		t.Fatalf("planned %v, want the period's end %v", p, at(30*86400))
	}
}
