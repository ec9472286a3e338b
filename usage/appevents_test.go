package usage

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"reflect"
	"testing"
	"time"

	"billing/appevents"
	"billing/billing"
	"billing/entitlements"
	"billing/internal/apitest"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
)

// newTellingEnv is newEnv with a teller of app events (not pushed), as main wires it.
func newTellingEnv(t *testing.T) *env {
	t.Helper()
	v := newEnv(t)
	logger := apitest.Logger(t, slog.LevelWarn)
	v.svc = New(Deps{
		DB: v.db, Stripe: stripeclient.New(v.proxy.URL, "sk_test_usage", logger),
		Periods: entitlements.New(entitlements.Deps{DB: v.db, Billing: billing.New(billing.Deps{DB: v.db, Logger: logger, Now: v.clock.Now}),
			Logger: logger, Now: v.clock.Now, Policy: entitlements.Policy{PastDueEntitled: true}}),
		ReportRate: 1000, Logger: logger, Now: v.clock.Now,
		AppEvents: appevents.NewTeller(nil),
	})
	v.e = apitest.Server(logger, v.svc.Mount)
	return v
}

// appEvent is a row of app_events.
type appEvent struct {
	UserID   string
	Livemode bool
	Sequence int64
	Type     string
	Subject  string
	Data     string
}

func (v *env) appEvents() []appEvent {
	v.t.Helper()
	var out []appEvent
	if err := v.db.Raw(`SELECT user_id, livemode, sequence, type, subject, data::text AS data
		FROM app_events ORDER BY user_id, sequence`).Scan(&out).Error; err != nil {
		v.t.Fatalf("list app events: %v", err)
	}
	return out
}

// expectReviewEvents checks that the app events are usage.needs_review events of u1 about the
// usage ids, in that order and numbered from 1, each with the record as the POST's repeat
// answers it now.
func (v *env) expectReviewEvents(usageIDs ...string) {
	v.t.Helper()
	evs := v.appEvents()
	if len(evs) != len(usageIDs) {
		v.t.Fatalf("%d app events, want %d (%v): %+v", len(evs), len(usageIDs), usageIDs, evs)
	}
	for i, ev := range evs {
		if ev.Type != appevents.TypeUsageNeedsReview || ev.UserID != "u1" || ev.Livemode || ev.Sequence != int64(i+1) ||
			ev.Subject != appevents.UsageSubject(usageIDs[i]) {
			v.t.Errorf("event %d: %+v, want usage.needs_review of u1 about %s, sequence %d", i, ev, usageIDs[i], i+1)
		}
		var got map[string]any
		if err := json.Unmarshal([]byte(ev.Data), &got); err != nil {
			v.t.Fatalf("event %d data %s: %v", i, ev.Data, err)
		}
		r := v.row("u1", usageIDs[i])
		rec := v.post("u1", map[string]any{"usage_id": r.UsageID, "meter": r.Meter, "value": r.Value})
		if rec.Code != http.StatusOK {
			v.t.Fatalf("repeat of %s: %d %s", usageIDs[i], rec.Code, rec.Body)
		}
		if want := apitest.Decode(v.t, rec); !reflect.DeepEqual(got, want) {
			v.t.Errorf("event %d data\n  %v\nPOST answers\n  %v", i, got, want)
		}
	}
}

// A record past the window goes to needs_review and the app is told, once: the reporter's next
// rounds and repeats of the POST tell nothing; a record reported tells nothing either.
func TestNeedsReviewIsTold(t *testing.T) {
	t.Parallel()
	v := newTellingEnv(t)
	v.addCustomer("u1", false)
	v.post("u1", map[string]any{"usage_id": "b", "meter": "api_calls", "value": 7})
	v.report()
	if r := v.row("u1", "b"); r.Status != stateReported {
		t.Fatalf("b: %+v, want reported", r)
	}
	v.post("u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 5})
	v.proxy.InjectFault(http.MethodPost, meterPath, stripeemu.FaultDrop, 3)
	v.report()
	v.expectReviewEvents()
	v.clock.Add(DefaultReviewAfter)
	v.report()
	if r := v.row("u1", "a"); r.Status != stateNeedsReview {
		t.Fatalf("a: %+v, want needs_review", r)
	}
	v.expectReviewEvents("a")
	var data map[string]any
	_ = json.Unmarshal([]byte(v.appEvents()[0].Data), &data)
	if data["status"] != stateNeedsReview || data["usage_id"] != "a" || data["value"] != float64(5) {
		t.Errorf("data %v", data)
	}
	v.clock.Add(time.Hour)
	v.report()
	v.expectReviewEvents("a")
}

// A record Stripe refuses is told as refused, once.
func TestRefusedIsTold(t *testing.T) {
	t.Parallel()
	v := newTellingEnv(t)
	v.addCustomer("u1", false)
	v.post("u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 5})
	v.proxy.Respond(http.MethodPost, meterPath, 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusBadRequest, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "parameter_invalid", "message": "No such meter."}}}
	})
	v.report()
	if r := v.row("u1", "a"); r.Status != stateRefused {
		t.Fatalf("row %+v, want refused", r)
	}
	v.expectReviewEvents("a")
	var data map[string]any
	_ = json.Unmarshal([]byte(v.appEvents()[0].Data), &data)
	if data["status"] != stateRefused || data["usage_id"] != "a" || data["identifier"] != "usage-u1-a" {
		t.Errorf("data %v", data)
	}
	v.clock.Add(time.Hour)
	v.report()
	v.expectReviewEvents("a")
}

// The event commits with the move: a transaction that fails at commit leaves the record pending
// and no event; the next round moves it and tells it with sequence 1.
func TestNeedsReviewRollsBackWithTheMove(t *testing.T) {
	t.Parallel()
	v := newTellingEnv(t)
	v.addCustomer("u1", false)
	v.post("u1", map[string]any{"usage_id": "a", "meter": "api_calls", "value": 5})
	v.proxy.InjectFault(http.MethodPost, meterPath, stripeemu.FaultDrop, 3)
	v.report()
	v.clock.Add(DefaultReviewAfter)
	v.exec(`CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'commit refused'; END $$`)
	v.exec(`CREATE CONSTRAINT TRIGGER fail_commit AFTER INSERT ON app_events DEFERRABLE INITIALLY DEFERRED
		FOR EACH ROW EXECUTE FUNCTION fail_commit()`)
	v.report()
	if r := v.row("u1", "a"); r.Status != statePending {
		t.Fatalf("after the failed commit: %+v, want pending", r)
	}
	v.expectReviewEvents()
	var answers int64
	v.db.Raw(`SELECT count(*) FROM app_event_answers`).Scan(&answers)
	if answers != 0 {
		t.Errorf("%d told answers after the rollback", answers)
	}
	v.exec(`DROP TRIGGER fail_commit ON app_events`)
	v.report()
	if r := v.row("u1", "a"); r.Status != stateNeedsReview {
		t.Fatalf("after the trigger is gone: %+v, want needs_review", r)
	}
	v.expectReviewEvents("a")
	if n := v.meters.Sends("usage-u1-a"); n != 0 {
		t.Errorf("%d sends of a", n)
	}
}
