package billing

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"billing/webhooks"
)

// The repository's testdata/stripe-events holds real Stripe event payloads of older API versions
// (SOURCES.md there gives each one's origin and license). Each is processed as if its api_version
// were the pinned one.

type fixture struct {
	file string
	ev   webhooks.Event
}

func loadFixtures(t *testing.T) []fixture {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "testdata", "stripe-events", "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures found: %v", err)
	}
	var out []fixture
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var env map[string]json.RawMessage
		if err := json.Unmarshal(raw, &env); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		env["api_version"] = json.RawMessage(`"` + webhooks.PinnedAPIVersion + `"`)
		payload, _ := json.Marshal(env)
		var head struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Created  int64  `json:"created"`
			Livemode bool   `json:"livemode"`
			Data     struct {
				Object             json.RawMessage `json:"object"`
				PreviousAttributes json.RawMessage `json:"previous_attributes"`
			} `json:"data"`
		}
		if err := json.Unmarshal(payload, &head); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out = append(out, fixture{file: filepath.Base(p), ev: webhooks.Event{
			ID: head.ID, Type: head.Type, Livemode: head.Livemode, APIVersion: webhooks.PinnedAPIVersion,
			Created: time.Unix(head.Created, 0).UTC(), Payload: payload,
			Object: head.Data.Object, PreviousAttributes: head.Data.PreviousAttributes,
		}})
	}
	return out
}

// What each handled fixture must leave behind: the subscription row it touches (none for a
// one-off invoice) and, for subscription events, the status and price read from it.
var fixtureWant = map[string]struct{ sub, customer, status, price string }{
	"customer.subscription.created--hookdeck--1.json":                {"sub_1MhUZrE0b6fckueSZfQ2Ytz6", "cus_NSPOMxl5eL01qM", "trialing", "price_1M3wjkE0b6fckueSKPgfRMSG"},
	"customer.subscription.created--stripe-ruby-mock--1.json":        {"sub_000000000000000000000000", "cus_00000000000000", "active", "price_000000000000000000000000"},
	"customer.subscription.created--supabase--1.json":                {"sub_JOFdYVhDqscfrZ", "cus_JHtTAbqbAF9V9U", "active", "price_1IDQm5JDPojXS6LNM31hxKzp"},
	"customer.subscription.created--supabase--2.json":                {"sub_JdIzvfy6o5GZRd", "cus_IhGfebO16cMIGN", "active", "price_1IDQm5JDPojXS6LNM31hxKzp"},
	"customer.subscription.deleted--stripe-ruby-mock--1.json":        {"sub_000000000000000000000000", "cus_00000000000000", "canceled", "price_000000000000000000000000"},
	"customer.subscription.deleted--stripe-ruby-mock--2.json":        {"sub_00000000000000", "cus_00000000000000", "canceled", "2bf80c62-01d6-403d-85d7-d54d9039d140"},
	"customer.subscription.deleted--supabase--1.json":                {"sub_JdIzvfy6o5GZRd", "cus_IhGfebO16cMIGN", "canceled", "price_1IDQm5JDPojXS6LNM31hxKzp"},
	"customer.subscription.trial_will_end--stripe-ruby-mock--1.json": {"sub_00000000000000", "cus_00000000000000", "trialing", "2bf80c62-01d6-403d-85d7-d54d9039d140"},
	"customer.subscription.trial_will_end--stripe-ruby-mock--2.json": {"sub_00000000000000", "cus_00000000000000", "trialing", "kx0AFo_00000000000000"},
	"customer.subscription.trial_will_end--stripe-ruby-mock--3.json": {"su_00000000000000", "cus_00000000000000", "trialing", "fkx0AFo_00000000000000"},
	"customer.subscription.updated--stripe-ruby-mock--1.json":        {"sub_000000000000000000000000", "cus_00000000000000", "active", "price_000000000000000000000000"},
	"customer.subscription.updated--stripe-ruby-mock--2.json":        {"sub_00000000000000", "cus_00000000000000", "canceled", "2bf80c62-01d6-403d-85d7-d54d9039d140"},
	"customer.subscription.updated--supabase--1.json":                {"sub_JLEPMp81LApOJl", "cus_IhGfebO16cMIGN", "active", "price_1IDQm5JDPojXS6LNM31hxKzp"},
	"invoice.paid--hookdeck--1.json":                                 {"sub_1MhUT5E0b6fckueSYAo1LoiF", "cus_NSPHp4fOlXGw8P", "", ""},
	"invoice.payment_failed--stripe-ruby-mock--1.json":               {"", "", "", ""},
	"invoice.payment_failed--stripe-ruby-mock--2.json":               {"sub_00000000000000", "cus_00000000000000", "", ""},
	"invoice.payment_failed--stripe-ruby-mock--3.json":               {"su_00000000000000", "cus_00000000000000", "", ""},
	"invoice.payment_succeeded--hookdeck--1.json":                    {"sub_1MhUT5E0b6fckueSYAo1LoiF", "cus_NSPHp4fOlXGw8P", "", ""},
	"invoice.payment_succeeded--stripe-rails--1.json":                {"", "", "", ""},
	"invoice.payment_succeeded--stripe-ruby-mock--1.json":            {"", "", "", ""},
	"invoice.payment_succeeded--stripe-ruby-mock--2.json":            {"sub_00000000000000", "cus_00000000000000", "", ""},
}

func TestFixturesProcessWithoutError(t *testing.T) {
	t.Parallel()
	fixtures := loadFixtures(t)
	handled := 0
	for _, f := range fixtures {
		want, isHandled := fixtureWant[f.file]
		t.Run(f.file, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			if _, ok := e.reg.Lookup(f.ev.Type); ok != isHandled {
				t.Fatalf("handler registered = %v for %s, want %v", ok, f.ev.Type, isHandled)
			}
			if !isHandled {
				return
			}
			e.link(t, "user_fixture", "cus_00000000000000", "fixture@example.com")
			if err := e.handle(t, f.ev); err != nil {
				t.Fatalf("handle: %v", err)
			}
			// Processing the same event again is a no-op, never an error.
			if err := e.handle(t, f.ev); err != nil {
				t.Fatalf("handle again: %v", err)
			}
			if want.sub == "" {
				if n := e.countSubs(t); n != 0 {
					t.Errorf("one-off invoice made %d subscription rows", n)
				}
				return
			}
			got := e.sub(t, want.sub)
			if got.StripeCustomerID != want.customer {
				t.Errorf("customer = %s, want %s", got.StripeCustomerID, want.customer)
			}
			if strings.HasPrefix(f.ev.Type, "customer.subscription.") {
				if got.Status != want.status || deref(got.PriceID) != want.price || ptrStr(got.SubEventID) != f.ev.ID {
					t.Errorf("status %q price %q event %s, want %q %q %s", got.Status, deref(got.PriceID), ptrStr(got.SubEventID), want.status, want.price, f.ev.ID)
				}
				if got.CurrentPeriodEnd == nil {
					t.Errorf("current_period_end not read")
				}
			} else {
				if got.InvEventCreated == nil || !got.InvEventCreated.Equal(f.ev.Created) {
					t.Errorf("invoice event not applied: inv_event_created %s", ptrTime(got.InvEventCreated))
				}
				if got.PaymentHold != (f.ev.Type == EventInvoicePaymentFailed) {
					t.Errorf("payment_hold = %v after %s", got.PaymentHold, f.ev.Type)
				}
			}
		})
		if isHandled {
			handled++
		}
	}
	if handled != len(fixtureWant) {
		t.Errorf("%d handled fixtures found, want %d (a fixture was added or renamed?)", handled, len(fixtureWant))
	}
}

// All fixtures one after the other in one database: they share ids across files, so this also
// exercises the guards on real data.
func TestFixturesInOneDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, f := range loadFixtures(t) {
		if _, ok := e.reg.Lookup(f.ev.Type); !ok {
			continue
		}
		if err := e.handle(t, f.ev); err != nil {
			t.Errorf("%s: %v", f.file, err)
		}
	}
	if n := e.countSubs(t); n == 0 {
		t.Error("no subscriptions stored")
	}
}
