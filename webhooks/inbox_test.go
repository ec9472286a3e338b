package webhooks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"billing/internal/stripeevents"
	"billing/webhooks"
)

func TestReceiveAnswers(t *testing.T) {
	t.Parallel()
	now := time.Now()
	valid := subEvent("evt_valid", now)
	live := stripeevents.SubscriptionEvent("evt_live", effectType, now, true, stripeevents.Subscription{ID: "sub_l", Customer: "cus_l", Status: "active"})
	unknown := stripeevents.Event("evt_unknown", "customer.created", now, false, map[string]any{"id": "cus_1", "object": "customer"}, nil)
	sign := stripeevents.SignatureHeader
	// Valid JSON for Go that PostgreSQL's jsonb refuses: never storable, so a 400, not a 5xx. Of a
	// handled type, whose body is kept; an ignored type's body is not stored, so it is no trouble.
	nulChar := []byte(`{"object":"event","id":"evt_nul","type":"` + effectType + `","livemode":false,"api_version":"2024-06-20","created":1700000000,"data":{"object":{"name":"a\u0000b"}}}`)
	badUTF8 := []byte("{\"object\":\"event\",\"id\":\"evt_utf\",\"type\":\"" + effectType + "\",\"livemode\":false,\"api_version\":\"2024-06-20\",\"created\":1700000000,\"data\":{\"object\":{\"name\":\"\xff\"}}}")
	ignoredNul := []byte(`{"object":"event","id":"evt_inul","type":"customer.created","livemode":false,"api_version":"2024-06-20","created":1700000000,"data":{"object":{"name":"a\u0000b"}}}`)

	tests := []struct {
		name       string
		payload    []byte
		header     string
		wantStatus int
		wantCode   string // error code, or the "status" of a 200
		stored     bool
	}{
		{"valid event", valid, sign(valid, testSecret, now), 200, "received", true},
		{"older rotated secret still verifies", subEvent("evt_rot", now), sign(subEvent("evt_rot", now), testSecretOld, now), 200, "received", true},
		{"live event with live secret", live, sign(live, liveSecret, now), 200, "received", true},
		{"live event signed with a test secret", live, sign(live, testSecret, now), 400, "livemode_mismatch", false},
		{"test event signed with the live secret", valid, sign(valid, liveSecret, now), 400, "livemode_mismatch", false},
		{"unhandled type is stored as ignored", unknown, sign(unknown, testSecret, now), 200, "ignored", true},
		{"no signature header", valid, "", 400, "missing_signature", false},
		{"header without v1", valid, fmt.Sprintf("t=%d", now.Unix()), 400, "malformed_signature", false},
		{"header without timestamp", valid, "v1=" + strings.Repeat("ab", 32), 400, "malformed_signature", false},
		{"v1 is not hex", valid, fmt.Sprintf("t=%d,v1=zz", now.Unix()), 400, "malformed_signature", false},
		{"wrong secret", valid, sign(valid, "whsec_other", now), 400, "invalid_signature", false},
		{"body changed after signing", valid, sign(append([]byte(" "), valid...), testSecret, now), 400, "invalid_signature", false},
		{"stale timestamp", valid, sign(valid, testSecret, now.Add(-6*time.Minute)), 400, "timestamp_outside_tolerance", false},
		{"timestamp from the future", valid, sign(valid, testSecret, now.Add(6*time.Minute)), 400, "timestamp_outside_tolerance", false},
		{"not JSON", []byte("hello"), sign([]byte("hello"), testSecret, now), 400, "invalid_event", false},
		{"JSON but not an event", []byte(`{"object":"customer","id":"cus_1"}`), sign([]byte(`{"object":"customer","id":"cus_1"}`), testSecret, now), 400, "invalid_event", false},
		{"NUL character jsonb cannot store", nulChar, sign(nulChar, testSecret, now), 400, "invalid_event", false},
		{"invalid UTF-8", badUTF8, sign(badUTF8, testSecret, now), 400, "invalid_event", false},
		{"ignored type with a body jsonb cannot store", ignoredNul, sign(ignoredNul, testSecret, now), 200, "ignored", true},
		{"event without livemode", []byte(`{"object":"event","id":"evt_x","type":"a.b","data":{"object":{}}}`), sign([]byte(`{"object":"event","id":"evt_x","type":"a.b","data":{"object":{}}}`), testSecret, now), 400, "invalid_event", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.clock.Set(now)
			got := h.post(tc.payload, tc.header)
			if got.Status != tc.wantStatus {
				t.Fatalf("status %d, want %d (%v)", got.Status, tc.wantStatus, got.Body)
			}
			code := got.errorCode()
			if tc.wantStatus == 200 {
				code, _ = got.Body["status"].(string)
			}
			if code != tc.wantCode {
				t.Errorf("code %q, want %q (%v)", code, tc.wantCode, got.Body)
			}
			rows := h.count(`SELECT count(*) FROM webhook_events`)
			jobs := h.count(`SELECT count(*) FROM river_job`)
			switch {
			case tc.stored && rows != 1:
				t.Errorf("%d events stored, want 1", rows)
			case !tc.stored && (rows != 0 || jobs != 0):
				t.Errorf("a rejected request wrote %d events and %d jobs", rows, jobs)
			}
			if tc.wantCode == "ignored" && jobs != 0 {
				t.Errorf("an ignored event enqueued %d jobs", jobs)
			}
		})
	}
}

// A live event while only test secrets are configured: its signature matches no secret, and the
// answer is the one of any wrong signature (it does not say that live mode has no secret).
func TestReceiveModeWithoutSecret(t *testing.T) {
	t.Parallel()
	h2 := newHarnessWithSecrets(t, []string{testSecret}, nil)
	live := stripeevents.SubscriptionEvent("evt_l", effectType, time.Now(), true, stripeevents.Subscription{ID: "sub_l", Status: "active"})
	got := h2.post(live, stripeevents.SignatureHeader(live, liveSecret, time.Now()))
	if got.Status != 400 || got.errorCode() != "invalid_signature" {
		t.Fatalf("got %d %v, want 400 invalid_signature", got.Status, got.Body)
	}
	if n := h2.count(`SELECT count(*) FROM webhook_events`); n != 0 {
		t.Errorf("%d events stored", n)
	}
}

func TestReceiveOversizeBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	big := bytes.Repeat([]byte("x"), webhooks.MaxBodyBytes+1)
	got := h.post(big, stripeevents.SignatureHeader(big, testSecret, time.Now()))
	if got.Status != http.StatusRequestEntityTooLarge || got.errorCode() != "body_too_large" {
		t.Fatalf("got %d %v, want 413 body_too_large", got.Status, got.Body)
	}
}

func TestReceiveAPIVersionMismatchIsDeadLettered(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var ev map[string]any
	if err := json.Unmarshal(subEvent("evt_oldver", time.Now()), &ev); err != nil {
		t.Fatal(err)
	}
	ev["api_version"] = "2020-08-27"
	payload, _ := json.Marshal(ev)
	got := h.deliver(payload)
	if got.Status != 200 {
		t.Fatalf("status %d, want 200: %v", got.Status, got.Body)
	}
	row, ok := h.event("evt_oldver")
	if !ok || row.Status != "failed" || row.FailureReason == nil || *row.FailureReason != "api_version_mismatch" {
		t.Fatalf("event row %+v (found %v), want failed with api_version_mismatch", row, ok)
	}
	if n := h.count(`SELECT count(*) FROM webhook_dead_letters WHERE event_id = 'evt_oldver' AND last_error LIKE 'api_version_mismatch%'`); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
	if n := h.count(`SELECT count(*) FROM river_job`); n != 0 {
		t.Errorf("%d jobs enqueued for a mismatched event", n)
	}
}

func TestDuplicateDeliveryAnswersDuplicateWhateverItsState(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	payload := subEvent("evt_dup", time.Now())
	if got := h.deliver(payload); got.Body["status"] != "received" {
		t.Fatalf("first delivery: %v", got.Body)
	}
	if got := h.deliver(payload); got.Status != 200 || got.Body["status"] != "duplicate" {
		t.Fatalf("redelivery before processing: %d %v", got.Status, got.Body)
	}
	h.start()
	h.waitStatus("evt_dup", "processed")
	if got := h.deliver(payload); got.Status != 200 || got.Body["status"] != "duplicate" {
		t.Fatalf("redelivery after processing: %d %v", got.Status, got.Body)
	}
	if n := h.count(`SELECT count(*) FROM river_job WHERE kind = $1`, webhooks.JobKindProcessEvent); n != 1 {
		t.Errorf("%d jobs, want 1", n)
	}
	if n := h.applied("evt_dup"); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}

// The crash-between-steps case: an event acknowledged while no worker ran (the process died
// right after the 200) is processed once a worker starts.
func TestEventStoredWithoutWorkerIsProcessedLater(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := range 5 {
		if got := h.deliver(subEvent(fmt.Sprintf("evt_later_%d", i), time.Now())); got.Status != 200 {
			t.Fatalf("deliver: %v", got.Body)
		}
	}
	if n := h.count(`SELECT count(*) FROM webhook_events WHERE status = 'received'`); n != 5 {
		t.Fatalf("%d received events before the worker starts, want 5", n)
	}
	h.start()
	for i := range 5 {
		id := fmt.Sprintf("evt_later_%d", i)
		row := h.waitStatus(id, "processed")
		if row.Attempts != 1 {
			t.Errorf("%s: %d attempts, want 1", id, row.Attempts)
		}
		if n := h.applied(id); n != 1 {
			t.Errorf("%s: effect applied %d times", id, n)
		}
	}
}

func TestConcurrentDeliveriesOfOneEvent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.start()
	payload := subEvent("evt_concurrent", time.Now())
	const n = 20
	received, duplicate := h.deliverConcurrently(payload, n)
	if received != 1 || duplicate != n-1 {
		t.Errorf("received %d, duplicate %d; want 1 and %d", received, duplicate, n-1)
	}
	h.waitStatus("evt_concurrent", "processed")
	if got := h.count(`SELECT count(*) FROM webhook_events`); got != 1 {
		t.Errorf("%d rows, want 1", got)
	}
	if got := h.applied("evt_concurrent"); got != 1 {
		t.Errorf("effect applied %d times, want 1", got)
	}
}

// A handler that keeps failing dead-letters its event after worker.max_attempts in all, on both
// paths: through the queue, and when the first attempt is the receive transaction's (it counts
// toward the limit). The admin then replays it once.
func TestFailingHandlerIsRetriedThenDeadLettered(t *testing.T) {
	t.Parallel()
	for name, newH := range map[string]func(*testing.T) *harness{
		"queue":  newHarness,
		"inline": func(t *testing.T) *harness { return newInlineHarness(t) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newH(t)
			h.failures.Store(1000)
			h.start()
			payload := stripeevents.InvoiceEvent("evt_fail", failingType, time.Now(), false, stripeevents.Invoice{ID: "in_1", Subscription: "sub_1"})
			if got := h.deliver(payload); got.Status != 200 {
				t.Fatalf("deliver: %v", got.Body)
			}
			row := h.waitStatus("evt_fail", "failed")
			if row.Attempts != 3 {
				t.Errorf("%d attempts, want 3", row.Attempts)
			}
			if row.FailureReason == nil || !strings.Contains(*row.FailureReason, "handler failed on purpose") {
				t.Errorf("failure reason %v", row.FailureReason)
			}
			if n := h.count(`SELECT count(*) FROM webhook_dead_letters WHERE event_id = 'evt_fail' AND attempts = 3`); n != 1 {
				t.Errorf("%d dead letters with 3 attempts, want 1", n)
			}
			if n := h.applied("evt_fail"); n != 0 {
				t.Errorf("a failed event left %d effects", n)
			}

			// The admin sees it, and replays it once the handler works again.
			list := h.admin(http.MethodGet, "/admin/events?status=failed", adminToken)
			events, _ := list.Body["events"].([]any)
			if list.Status != 200 || len(events) != 1 {
				t.Fatalf("failed events: %d %v", list.Status, list.Body)
			}
			h.failures.Store(0)
			if got := h.admin(http.MethodPost, "/admin/events/evt_fail/replay", adminToken); got.Status != http.StatusAccepted {
				t.Fatalf("replay: %d %v", got.Status, got.Body)
			}
			row = h.waitStatus("evt_fail", "processed")
			if row.Attempts != 1 {
				t.Errorf("after replay: %d attempts, want 1 (reset by the replay)", row.Attempts)
			}
			if n := h.count(`SELECT count(*) FROM webhook_dead_letters`); n != 0 {
				t.Errorf("%d dead letters left after a successful replay", n)
			}
			if n := h.applied("evt_fail"); n != 1 {
				t.Errorf("effect applied %d times, want 1", n)
			}
			if got := h.admin(http.MethodPost, "/admin/events/evt_fail/replay", adminToken); got.Status != http.StatusConflict || got.errorCode() != "event_already_processed" {
				t.Errorf("replay of a processed event: %d %v, want 409", got.Status, got.Body)
			}
		})
	}
}

func TestTransientFailureSucceedsOnRetry(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.failures.Store(2)
	h.start()
	payload := stripeevents.InvoiceEvent("evt_flaky", failingType, time.Now(), false, stripeevents.Invoice{ID: "in_1", Subscription: "sub_1"})
	h.deliver(payload)
	row := h.waitStatus("evt_flaky", "processed")
	if row.Attempts != 3 {
		t.Errorf("%d attempts, want 3", row.Attempts)
	}
	if row.FailureReason != nil {
		t.Errorf("failure reason %q kept after success", *row.FailureReason)
	}
	if n := h.applied("evt_flaky"); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}

func TestAdminEventAPI(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	base := time.Now()
	h.deliver(subEvent("evt_a", base))
	h.clock.Set(base.Add(time.Second))
	unknown := stripeevents.Event("evt_b", "customer.created", base, false, map[string]any{"id": "cus_1", "object": "customer"}, nil)
	h.deliver(unknown)

	tests := []struct {
		name, path, token string
		status            int
		ids               []string
	}{
		{"newest first", "/admin/events", adminToken, 200, []string{"evt_b", "evt_a"}},
		{"by status", "/admin/events?status=ignored", adminToken, 200, []string{"evt_b"}},
		{"by type", "/admin/events?type=" + effectType, adminToken, 200, []string{"evt_a"}},
		{"limit", "/admin/events?limit=1", adminToken, 200, []string{"evt_b"}},
		{"bad status", "/admin/events?status=nope", adminToken, 400, nil},
		{"bad limit", "/admin/events?limit=0", adminToken, 400, nil},
		{"no token", "/admin/events", "", 401, nil},
		{"app token", "/admin/events", appToken, 403, nil},
	}
	for _, tc := range tests {
		got := h.admin(http.MethodGet, tc.path, tc.token)
		if got.Status != tc.status {
			t.Errorf("%s: status %d, want %d (%v)", tc.name, got.Status, tc.status, got.Body)
			continue
		}
		if tc.ids == nil {
			continue
		}
		events, _ := got.Body["events"].([]any)
		var ids []string
		for _, e := range events {
			ids = append(ids, e.(map[string]any)["event_id"].(string))
		}
		if fmt.Sprint(ids) != fmt.Sprint(tc.ids) {
			t.Errorf("%s: ids %v, want %v", tc.name, ids, tc.ids)
		}
	}

	one := h.admin(http.MethodGet, "/admin/events/evt_a", adminToken)
	if one.Status != 200 {
		t.Fatalf("get event: %d %v", one.Status, one.Body)
	}
	for _, k := range []string{"event_id", "type", "status", "livemode", "attempts", "received_at", "processed_at", "failure_reason", "payload"} {
		if _, ok := one.Body[k]; !ok {
			t.Errorf("event has no %q field", k)
		}
	}
	if p, _ := one.Body["payload"].(map[string]any); p["id"] != "evt_a" {
		t.Errorf("payload %v", one.Body["payload"])
	}
	if got := h.admin(http.MethodGet, "/admin/events/evt_nope", adminToken); got.Status != 404 {
		t.Errorf("unknown event: %d", got.Status)
	}
	if got := h.admin(http.MethodPost, "/admin/events/evt_b/replay", adminToken); got.Status != 409 {
		t.Errorf("replay of an ignored event: %d %v", got.Status, got.Body)
	}
}

// The database is unreachable: the endpoint answers 503 so that Stripe retries.
func TestReceiveDatabaseDown(t *testing.T) {
	t.Parallel()
	// A pool whose server is gone: port 1 on loopback refuses connections.
	down, err := gorm.Open(postgres.Open("postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2"),
		&gorm.Config{Logger: logger.Default.LogMode(logger.Silent), DisableAutomaticPing: true})
	if err != nil {
		t.Fatal(err)
	}
	h2 := newHarnessOn(t, down)
	got := h2.deliver(subEvent("evt_down", time.Now()))
	if got.Status != http.StatusServiceUnavailable || got.errorCode() != "database_unavailable" {
		t.Fatalf("got %d %v, want 503 database_unavailable", got.Status, got.Body)
	}
}

// Real payloads captured from Stripe (older API versions, rewritten to the pinned one; see
// testdata/stripe-events/SOURCES.md at the repository's root) are stored and acknowledged like
// any other.
func TestRealFixturesAreReceived(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("..", "testdata", "stripe-events", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in the repository's testdata/stripe-events: %v", err)
	}
	h := newHarness(t)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var ev map[string]any
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		ev["api_version"] = webhooks.PinnedAPIVersion
		ev["id"] = fmt.Sprintf("%v_%s", ev["id"], filepath.Base(f)) // fixtures share placeholder ids
		payload, _ := json.Marshal(ev)
		got := h.deliver(payload)
		want := "ignored"
		if ev["type"] == effectType || ev["type"] == failingType {
			want = "received"
		}
		if got.Status != 200 || got.Body["status"] != want {
			t.Errorf("%s: %d %v, want 200 %s", filepath.Base(f), got.Status, got.Body, want)
		}
	}
}

func TestReadyEndpointsNeedNoAuth(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		rec := httptest.NewRecorder()
		h.e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		if rec.Code != 200 {
			t.Errorf("%s: %d", p, rec.Code)
		}
	}
}

// The sweeper is the second line of defence for "no acknowledged event is left unprocessed": an
// event whose job is gone (River discarded it, someone deleted it) gets a new one; an event with
// a live job is left alone.
func TestSweepReenqueuesEventsWithoutALiveJob(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.deliver(subEvent("evt_orphan", time.Now()))
	h.deliver(subEvent("evt_queued", time.Now()))
	if err := h.db.Exec(`DELETE FROM river_job WHERE args->>'event_id' = 'evt_orphan'`).Error; err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h.clock.Add(time.Second)
	if n, err := h.inbox.Sweep(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("sweep of events younger than the age: %d, %v; want 0", n, err)
	}
	if n, err := h.inbox.Sweep(ctx, 0); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v; want exactly the orphan", n, err)
	}
	if n, err := h.inbox.Sweep(ctx, 0); err != nil || n != 0 {
		t.Fatalf("second sweep: %d, %v; want 0 (the orphan has a job now)", n, err)
	}
	h.start()
	for _, id := range []string{"evt_orphan", "evt_queued"} {
		h.waitStatus(id, "processed")
		if n := h.applied(id); n != 1 {
			t.Errorf("%s: effect applied %d times, want 1", id, n)
		}
	}
}

// The receive path writes the processing job with its own SQL (one statement with the event).
// Its row must be the one River's own InsertTx writes for the same args, column by column, so
// that River's workers, rescuer and cleaner treat both alike. Ids and timestamps differ by nature.
func TestReceivedJobIsTheRowRiverWouldInsert(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	if got := h.deliver(subEvent("evt_job", time.Now())); got.Status != 200 || got.Body["status"] != "received" {
		t.Fatalf("deliver: %d %v", got.Status, got.Body)
	}
	// A second job for the same event, by River: same args, so the rows compare whole.
	sqlDB, err := h.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	test := false
	inserted, err := h.river.InsertTx(ctx, tx, webhooks.ProcessEventArgs{EventID: "evt_job", Livemode: &test}, nil)
	if err != nil {
		_ = tx.Rollback()
		t.Fatalf("River's InsertTx: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	var rows []struct {
		ByRiver bool
		Due     bool
		Columns string
	}
	err = h.db.Raw(`
		SELECT id = $1 AS by_river, scheduled_at <= now() AS due,
		       CAST(to_jsonb(j) - 'id' - 'created_at' - 'scheduled_at' AS text) AS columns
		FROM river_job j WHERE args->>'event_id' = $2`, inserted.Job.ID, "evt_job").Scan(&rows).Error
	if err != nil || len(rows) != 2 || rows[0].ByRiver == rows[1].ByRiver {
		t.Fatalf("jobs of evt_job: %+v, %v; want one by the receive path and one by River", rows, err)
	}
	var ours, rivers map[string]any
	for _, r := range rows {
		var cols map[string]any
		if err := json.Unmarshal([]byte(r.Columns), &cols); err != nil {
			t.Fatal(err)
		}
		if !r.Due {
			t.Errorf("job (by River: %v) is scheduled in the future", r.ByRiver)
		}
		if r.ByRiver {
			rivers = cols
		} else {
			ours = cols
		}
	}
	// Every column River has, not a chosen few: one it adds later is compared too. These must be
	// among them, or the comparison would prove little.
	for _, c := range []string{"args", "kind", "max_attempts", "priority", "queue", "state", "tags", "metadata",
		"attempt", "attempted_at", "attempted_by", "errors", "finalized_at", "unique_key", "unique_states"} {
		if _, ok := rivers[c]; !ok {
			t.Errorf("River's row has no column %s", c)
		}
	}
	for c := range rivers {
		if _, ok := ours[c]; !ok {
			t.Errorf("column %s: missing from the receive path's row", c)
		}
	}
	for c, want := range rivers {
		if got := ours[c]; !reflect.DeepEqual(got, want) {
			t.Errorf("column %s: the receive path wrote %v, River's InsertTx %v", c, got, want)
		}
	}
	if ours["kind"] != webhooks.JobKindProcessEvent || ours["queue"] != webhooks.QueueWebhooks || ours["state"] != "available" {
		t.Errorf("job %v: want an available %s job in queue %s", ours, webhooks.JobKindProcessEvent, webhooks.QueueWebhooks)
	}

	// River runs and completes both; the event's status makes the second one a no-op.
	h.start()
	if row := h.waitStatus("evt_job", "processed"); row.Attempts != 1 {
		t.Errorf("%d attempts, want 1", row.Attempts)
	}
	h.waitCount(`SELECT count(*) FROM river_job WHERE args->>'event_id' = 'evt_job' AND state = 'completed'`, 2)
	if n := h.applied("evt_job"); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
}
