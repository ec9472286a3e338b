package customers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/webhooks"
)

// eventBase is an arbitrary instant (2024-06-01T00:00:00Z) that event times count from.
const eventBase int64 = 1717200000

// customerEvent is a customer.* event of the given mode created at eventBase+created.
func customerEvent(id, typ string, created int64, live bool, obj map[string]any) webhooks.Event {
	obj["object"] = "customer"
	obj["livemode"] = live
	raw, _ := json.Marshal(obj)
	payload, _ := json.Marshal(map[string]any{"id": id, "object": "event", "type": typ, "api_version": webhooks.PinnedAPIVersion,
		"created": eventBase + created, "livemode": live, "data": map[string]any{"object": json.RawMessage(raw)}})
	return webhooks.Event{ID: id, Type: typ, Livemode: live, APIVersion: webhooks.PinnedAPIVersion,
		Created: time.Unix(eventBase+created, 0).UTC(), Payload: payload, Object: raw}
}

func updatedEv(id string, created int64, customerID string, email, name any) webhooks.Event {
	return customerEvent(id, EventCustomerUpdated, created, false, map[string]any{"id": customerID, "email": email, "name": name})
}

func deletedEv(id string, created int64, customerID string) webhooks.Event {
	return customerEvent(id, EventCustomerDeleted, created, false, map[string]any{"id": customerID, "deleted": true})
}

// handle runs an event's registered handler in its own transaction, as the inbox's worker does.
func (v *env) handle(ev webhooks.Event) error {
	v.t.Helper()
	reg := webhooks.NewRegistry()
	Register(reg)
	h, ok := reg.Lookup(ev.Type)
	if !ok {
		v.t.Fatalf("no handler for %s", ev.Type)
	}
	return v.db.Transaction(func(tx *gorm.DB) error { return h.HandleEvent(context.Background(), tx, ev) })
}

func (v *env) mustHandle(evs ...webhooks.Event) {
	v.t.Helper()
	for _, ev := range evs {
		if err := v.handle(ev); err != nil {
			v.t.Fatalf("handle %s %s: %v", ev.Type, ev.ID, err)
		}
	}
}

// linkRow is everything stored about a link, for before/after checks.
func (v *env) linkRow(userID string) string {
	v.t.Helper()
	var rows []string
	if err := v.db.Raw(`SELECT (to_jsonb(c) - 'updated_at')::text FROM customers c WHERE user_id = $1`, userID).Scan(&rows).Error; err != nil {
		v.t.Fatal(err)
	}
	return strings.Join(rows, "")
}

func TestCustomerEventTypesAreStripeGos(t *testing.T) {
	t.Parallel()
	reg := webhooks.NewRegistry()
	Register(reg)
	want := []string{string(stripe.EventTypeCustomerDeleted), string(stripe.EventTypeCustomerUpdated)}
	if got := reg.Types(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("types %v, want %v", got, want)
	}
}

// customer.updated brings email and name; an older one delivered late does not undo a newer one.
func TestCustomerUpdatedKeepsTheNewestEmailAndName(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email, name) VALUES ('u1', 'cus_1', 'first@example.com', 'First')`)
	v.mustHandle(updatedEv("e20", 20, "cus_1", "new@example.com", "New Name"))
	if c := v.row("u1"); c.Email != "new@example.com" || c.Name != "New Name" {
		t.Fatalf("after the update: %+v", c)
	}
	v.mustHandle(updatedEv("e10", 10, "cus_1", "old@example.com", "Old"), updatedEv("e20", 20, "cus_1", "new@example.com", "New Name"))
	if c := v.row("u1"); c.Email != "new@example.com" || c.Name != "New Name" {
		t.Errorf("an older update overwrote a newer one: %+v", c)
	}
	// Stripe's null is the empty string here.
	v.mustHandle(updatedEv("e30", 30, "cus_1", nil, nil))
	if c := v.row("u1"); c.Email != "" || c.Name != "" {
		t.Errorf("after nulls: %+v", c)
	}
	// A customer nobody is linked to: acknowledged, nothing written.
	v.mustHandle(updatedEv("e40", 40, "cus_unknown", "x@example.com", "X"))
	var n int64
	v.db.Raw(`SELECT count(*) FROM customers WHERE email = 'x@example.com'`).Scan(&n)
	if n != 0 {
		t.Errorf("%d rows took an unknown customer's email", n)
	}
}

// A PUT's new email is newer than any customer.updated from before it.
func TestPutIsNewerThanALateCustomerUpdated(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	expectStatus(t, v.put("u1", map[string]any{"email": "one@example.com", "name": "One"}), http.StatusCreated)
	first := v.row("u1")
	cus := first.StripeID()
	expectStatus(t, v.put("u1", map[string]any{"email": "two@example.com", "name": "Two"}), http.StatusOK)
	before := time.Now().Add(-time.Minute).Unix() - eventBase
	v.mustHandle(updatedEv("e_before_put", before, cus, "one@example.com", "One"))
	if c := v.row("u1"); c.Email != "two@example.com" || c.Name != "Two" {
		t.Errorf("a late event from before the PUT undid it: %+v", c)
	}
	after := time.Now().Add(time.Minute).Unix() - eventBase
	v.mustHandle(updatedEv("e_after_put", after, cus, "three@example.com", "Three"))
	if c := v.row("u1"); c.Email != "three@example.com" {
		t.Errorf("a newer event was not applied: %+v", c)
	}
}

// customer.deleted ends the link: it no longer calls out, and no update applies after it.
func TestCustomerDeletedEndsTheLink(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('u1', 'cus_1', 'a@example.com')`)
	if _, err := Get(context.Background(), v.db, "u1", false); err != nil {
		t.Fatalf("before: %v", err)
	}
	v.mustHandle(updatedEv("e30", 30, "cus_1", "late@example.com", "Late"), deletedEv("d20", 20, "cus_1"))
	if _, err := Get(context.Background(), v.db, "u1", false); !errors.Is(err, ErrNotFound) {
		t.Errorf("a deleted customer is still a link: %v", err)
	}
	row := v.linkRow("u1")
	if !strings.Contains(row, `"deleted_at": "2024-06-01T00:00:20+00:00"`) {
		t.Errorf("row: %s", row)
	}
	v.mustHandle(deletedEv("d20", 20, "cus_1"), updatedEv("e40", 40, "cus_1", "after@example.com", "After"), deletedEv("d50", 50, "cus_1"))
	if after := v.linkRow("u1"); after != row {
		t.Errorf("changed after the deletion:\nbefore %s\nafter  %s", row, after)
	}
}

// An event of the other mode naming a linked customer's id is of the other world, where no user
// is linked to it: acknowledged, and nothing of this world changes.
func TestCustomerEventsOfTheOtherMode(t *testing.T) {
	t.Parallel()
	for _, linkLive := range []bool{false, true} {
		for _, typ := range []string{EventCustomerUpdated, EventCustomerDeleted} {
			v := newEnv(t, linkLive)
			v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('u1', 'cus_1', $1, $2)`, "a@example.com", linkLive)
			before := v.linkRow("u1")
			err := v.handle(customerEvent("x1", typ, 100, !linkLive, map[string]any{"id": "cus_1", "email": "evil@example.com", "name": "Evil"}))
			if err != nil {
				t.Errorf("link live=%v, %s: %v, want it acknowledged", linkLive, typ, err)
			}
			if after := v.linkRow("u1"); after != before {
				t.Errorf("link live=%v, %s: row changed:\nbefore %s\nafter  %s", linkLive, typ, before, after)
			}
		}
	}
}

func TestMalformedCustomerEventsArePermanent(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	for _, obj := range []string{`[]`, `{"email":"a@example.com"}`, `{"id": 5}`} {
		ev := updatedEv("m1", 1, "cus_1", nil, nil)
		ev.Object = json.RawMessage(obj)
		if err := v.handle(ev); err == nil || !webhooks.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent failure", obj, err)
		}
	}
}
