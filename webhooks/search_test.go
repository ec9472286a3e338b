package webhooks_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"billing/internal/stripeevents"
	"billing/webhooks"
)

// logEvents stores a small log (no worker runs: each stays as the test sets it) and pins each
// event's received_at, two of them in the same microsecond so that paging must break the tie.
func logEvents(t *testing.T, h *harness) time.Time {
	t.Helper()
	base := time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)
	h.clock.Set(time.Now())
	sub := func(id, subID, cus string) []byte {
		return stripeevents.SubscriptionEvent(id, effectType, h.clock.Now(), false,
			stripeevents.Subscription{ID: subID, Customer: cus, Status: "active"})
	}
	inv := func(id, subID string) []byte {
		return stripeevents.InvoiceEvent(id, failingType, h.clock.Now(), false,
			stripeevents.Invoice{ID: "in_" + id, Customer: "cus_a", Subscription: subID, Status: "open", Currency: "usd", AmountDue: 100})
	}
	deliveries := []struct {
		payload  []byte
		live     bool
		received time.Time
	}{
		{sub("evt_1", "sub_a", "cus_a"), false, base.Add(1 * time.Hour)},
		{inv("evt_2", "sub_a"), false, base.Add(2 * time.Hour)},
		{sub("evt_3", "sub_b", "cus_b"), false, base.Add(3 * time.Hour)},
		{sub("evt_4a", "sub_b", "cus_b"), false, base.Add(4 * time.Hour)},
		{sub("evt_4b", "sub_c", "cus_c"), false, base.Add(4 * time.Hour)},
		{inv("evt_5", "sub_c"), false, base.Add(26 * time.Hour)},
		{stripeevents.SubscriptionEvent("evt_6", effectType, h.clock.Now(), true,
			stripeevents.Subscription{ID: "sub_live", Customer: "cus_live", Status: "active"}), true, base.Add(27 * time.Hour)},
	}
	for _, d := range deliveries {
		secret := testSecret
		if d.live {
			secret = liveSecret
		}
		if a := h.post(d.payload, stripeevents.SignatureHeader(d.payload, secret, h.clock.Now())); a.Status != 200 {
			t.Fatalf("deliver: %d %v", a.Status, a.Body)
		}
	}
	for i, d := range deliveries {
		id := []string{"evt_1", "evt_2", "evt_3", "evt_4a", "evt_4b", "evt_5", "evt_6"}[i]
		if err := h.db.Exec(`UPDATE webhook_events SET received_at = $2 WHERE event_id = $1`, id, d.received).Error; err != nil {
			t.Fatal(err)
		}
	}
	h.exec(t, `UPDATE webhook_events SET status = 'processed', processed_at = received_at + interval '2 seconds'
		WHERE event_id IN ('evt_1', 'evt_3', 'evt_4a')`)
	h.exec(t, `UPDATE webhook_events SET status = 'failed', attempts = 3, failure_reason = 'handler_error' WHERE event_id = 'evt_2'`)
	h.exec(t, `INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error, dead_at) VALUES ('evt_2', false, 3, 'boom', $1)`, base.Add(3*time.Hour))
	return base
}

func (h *harness) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if err := h.db.Exec(sql, args...).Error; err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func ids(events []webhooks.LoggedEvent) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.EventID
	}
	return out
}

func TestSearchEventsFiltersSearchesAndPages(t *testing.T) {
	t.Parallel()
	h := newHarnessWithSecrets(t, []string{testSecret}, []string{liveSecret})
	base := logEvents(t, h)
	ctx := context.Background()
	search := func(q webhooks.EventQuery) *webhooks.EventPage {
		t.Helper()
		p, err := h.inbox.SearchEvents(ctx, q)
		if err != nil {
			t.Fatalf("search %+v: %v", q, err)
		}
		return p
	}

	// Newest first; the tie at 04:00 is broken by event id, descending.
	all := []string{"evt_6", "evt_5", "evt_4b", "evt_4a", "evt_3", "evt_2", "evt_1"}
	if got := ids(search(webhooks.EventQuery{}).Events); !slices.Equal(got, all) {
		t.Fatalf("log %v, want %v", got, all)
	}

	// Paging two at a time reaches every event once, older and back newer.
	var walked []string
	var pages []*webhooks.EventPage
	q := webhooks.EventQuery{Limit: 2}
	for {
		p := search(q)
		pages = append(pages, p)
		walked = append(walked, ids(p.Events)...)
		if !p.HasOlder {
			break
		}
		last := p.Events[len(p.Events)-1]
		q.Before = &webhooks.EventCursor{ReceivedAt: last.ReceivedAt, EventID: last.EventID}
		// The cursor survives its URL form.
		if c, err := webhooks.ParseEventCursor(q.Before.String()); err != nil || !c.ReceivedAt.Equal(q.Before.ReceivedAt) || c.EventID != q.Before.EventID {
			t.Fatalf("cursor %q parsed as %+v, %v", q.Before.String(), c, err)
		}
	}
	if !slices.Equal(walked, all) || len(pages) != 4 || pages[0].HasNewer || !pages[3].HasNewer {
		t.Fatalf("paged %v in %d pages (first has newer %v), want %v", walked, len(pages), pages[0].HasNewer, all)
	}
	first := pages[2].Events[0]
	back := search(webhooks.EventQuery{Limit: 2, After: &webhooks.EventCursor{ReceivedAt: first.ReceivedAt, EventID: first.EventID}})
	if got := ids(back.Events); !slices.Equal(got, ids(pages[1].Events)) || !back.HasNewer || !back.HasOlder {
		t.Errorf("newer page %v (newer %v), want %v", got, back.HasNewer, ids(pages[1].Events))
	}

	live, test := true, false
	for _, tc := range []struct {
		name string
		q    webhooks.EventQuery
		want []string
	}{
		{"by subscription: its events and its invoices'", webhooks.EventQuery{Search: "sub_a"}, []string{"evt_2", "evt_1"}},
		{"by customer", webhooks.EventQuery{Search: "cus_b"}, []string{"evt_4a", "evt_3"}},
		{"by event id", webhooks.EventQuery{Search: "evt_4b"}, []string{"evt_4b"}},
		{"by invoice id", webhooks.EventQuery{Search: "in_evt_5"}, []string{"evt_5"}},
		{"nothing", webhooks.EventQuery{Search: "sub_none"}, []string{}},
		{"by type", webhooks.EventQuery{Type: failingType}, []string{"evt_5", "evt_2"}},
		{"by status", webhooks.EventQuery{Status: "processed"}, []string{"evt_4a", "evt_3", "evt_1"}},
		{"live", webhooks.EventQuery{Livemode: &live}, []string{"evt_6"}},
		{"test, failed", webhooks.EventQuery{Livemode: &test, Status: "failed"}, []string{"evt_2"}},
		{"one day", webhooks.EventQuery{ReceivedFrom: base, ReceivedTo: base.Add(24 * time.Hour)},
			[]string{"evt_4b", "evt_4a", "evt_3", "evt_2", "evt_1"}},
		{"from the second day", webhooks.EventQuery{ReceivedFrom: base.Add(24 * time.Hour)}, []string{"evt_6", "evt_5"}},
		{"search and type", webhooks.EventQuery{Search: "sub_c", Type: effectType}, []string{"evt_4b"}},
	} {
		if got := ids(search(tc.q).Events); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}

	// The named object is read from the payload.
	p := search(webhooks.EventQuery{Search: "evt_2"})
	if e := p.Events[0]; deref(e.ObjectID) != "in_evt_2" || deref(e.ObjectType) != "invoice" ||
		deref(e.SubscriptionID) != "sub_a" || deref(e.CustomerID) != "cus_a" {
		t.Errorf("named object of evt_2: %v %v %v %v", deref(e.ObjectID), deref(e.ObjectType), deref(e.SubscriptionID), deref(e.CustomerID))
	}
	if _, err := h.inbox.SearchEvents(ctx, webhooks.EventQuery{Status: "nope"}); err == nil {
		t.Error("an unknown status is accepted")
	}
}

func deref(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func TestEventDetailEventsNamingAndStats(t *testing.T) {
	t.Parallel()
	h := newHarnessWithSecrets(t, []string{testSecret}, []string{liveSecret})
	base := logEvents(t, h)
	ctx := context.Background()

	d, err := h.inbox.EventDetail(ctx, "evt_2")
	if err != nil || d == nil {
		t.Fatalf("detail: %v %v", d, err)
	}
	if d.Status != "failed" || d.DeadLetter == nil || d.DeadLetter.LastError != "boom" || d.DeadLetter.Attempts != 3 ||
		len(d.Payload) == 0 || d.EventCreated == nil {
		t.Errorf("detail of evt_2: %+v, dead letter %+v", d.EventView, d.DeadLetter)
	}
	if d, err := h.inbox.EventDetail(ctx, "evt_1"); err != nil || d == nil || d.DeadLetter != nil {
		t.Errorf("detail of evt_1: %+v %v", d, err)
	}
	if d, err := h.inbox.EventDetail(ctx, "evt_none"); err != nil || d != nil {
		t.Errorf("detail of an unknown event: %+v %v", d, err)
	}

	named, err := h.inbox.EventsNaming(ctx, "sub_b", 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(named); !slices.Equal(got, []string{"evt_3", "evt_4a"}) || len(named[0].Object) == 0 {
		t.Errorf("events naming sub_b: %v", got)
	}
	if named, _ := h.inbox.EventsNaming(ctx, "sub_b", 1); !slices.Equal(ids(named), []string{"evt_4a"}) {
		t.Errorf("the newest event naming sub_b: %v", ids(named))
	}

	// Waiting: evt_4b, evt_5, evt_6; lag of the processed ones received since 02:00: 2 s each.
	s, err := h.inbox.Stats(ctx, base.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if s.DeadLetters != 1 || s.Waiting != 3 || s.OldestWaiting == nil || !s.OldestWaiting.Equal(base.Add(4*time.Hour)) ||
		s.LagEvents != 2 || s.LagMedian == nil || *s.LagMedian != 2 || s.LagMax == nil || *s.LagMax != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestReplayDeadLettersOfAType(t *testing.T) {
	t.Parallel()
	h := newHarnessWithSecrets(t, []string{testSecret}, []string{liveSecret})
	base := logEvents(t, h)
	ctx := context.Background()
	// Dead letters: evt_2 (failingType, 03:00), evt_5 (failingType, 05:00), evt_4b (effectType).
	h.exec(t, `UPDATE webhook_events SET status = 'failed', attempts = 3 WHERE event_id IN ('evt_5', 'evt_4b')`)
	h.exec(t, `INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error, dead_at) VALUES
		('evt_5', false, 3, 'boom', $1), ('evt_4b', false, 3, 'other', $2)`, base.Add(5*time.Hour), base.Add(6*time.Hour))

	types, err := h.inbox.DeadLetterTypes(ctx)
	if err != nil || len(types) != 2 || types[0].Type != failingType || types[0].Count != 2 || types[1].Count != 1 {
		t.Fatalf("types %+v %v", types, err)
	}

	// The confirmation was shown at 04:00: only evt_2 was dead then.
	q := webhooks.DeadLetterQuery{Type: failingType, DeadAtOrBefore: base.Add(4 * time.Hour)}
	if n, err := h.inbox.CountDeadLetters(ctx, q); err != nil || n != 1 {
		t.Fatalf("count %d %v", n, err)
	}
	replayed, remaining, err := h.inbox.ReplayDeadLetters(ctx, q, 10)
	if err != nil || replayed != 1 || remaining != 0 {
		t.Fatalf("replay: %d replayed, %d remaining, %v", replayed, remaining, err)
	}
	for id, want := range map[string]string{"evt_2": "received", "evt_5": "failed", "evt_4b": "failed"} {
		if row, _ := h.event(id); row.Status != want {
			t.Errorf("%s is %s, want %s", id, row.Status, want)
		}
	}

	// With a limit, what is left is counted.
	h.exec(t, `UPDATE webhook_events SET status = 'failed' WHERE event_id = 'evt_3'`)
	h.exec(t, `INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error, dead_at) VALUES ('evt_3', false, 3, 'x', $1)`, base.Add(5*time.Hour))
	q = webhooks.DeadLetterQuery{Type: effectType}
	replayed, remaining, err = h.inbox.ReplayDeadLetters(ctx, q, 1)
	if err != nil || replayed != 1 || remaining != 1 {
		t.Fatalf("replay one of two: %d replayed, %d remaining, %v", replayed, remaining, err)
	}
	list, err := h.inbox.DeadLetterList(ctx, webhooks.DeadLetterQuery{})
	if err != nil || len(list) != 2 {
		t.Fatalf("left: %+v %v", list, err)
	}
	// Each replay queued a job.
	if n := h.count(`SELECT count(*) FROM river_job WHERE args->>'event_id' IN ('evt_2', 'evt_4b', 'evt_3')`); n < 2 {
		t.Errorf("%d jobs queued by the replays", n)
	}
}
