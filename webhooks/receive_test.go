package webhooks_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"billing/internal/stripeevents"
)

// storesNothing fails the test if any event or job was written.
func (h *harness) storesNothing() {
	h.t.Helper()
	if rows, jobs := h.count(`SELECT count(*) FROM webhook_events`), h.count(`SELECT count(*) FROM river_job`); rows != 0 || jobs != 0 {
		h.t.Errorf("a rejected request wrote %d events and %d jobs", rows, jobs)
	}
}

func (h *harness) expect(got answer, status int, code string) {
	h.t.Helper()
	if got.Status != status || got.errorCode() != code {
		h.t.Fatalf("got %d %v, want %d %s", got.Status, got.Body, status, code)
	}
}

// Nothing of the body is read before its signature is verified: a body that is not JSON gets the
// answer of its signature, never a parser's message.
func TestReceiveVerifiesBeforeParsing(t *testing.T) {
	t.Parallel()
	now := time.Now()
	garbage := []byte(`{"id": "evt_1", "type": tru`)
	zeros := strings.Repeat("0", 64)
	tests := []struct {
		name, header, code string
	}{
		{"garbage signature", fmt.Sprintf("t=%d,v1=%s", now.Unix(), zeros), "invalid_signature"},
		{"unknown secret", stripeevents.SignatureHeader(garbage, "whsec_unknown", now), "invalid_signature"},
		{"stale signature of a configured secret", stripeevents.SignatureHeader(garbage, testSecret, now.Add(-time.Hour)), "timestamp_outside_tolerance"},
		{"stale garbage signature", fmt.Sprintf("t=%d,v1=%s", now.Add(-time.Hour).Unix(), zeros), "invalid_signature"},
		// Only a verified body is parsed.
		{"valid signature", stripeevents.SignatureHeader(garbage, testSecret, now), "invalid_event"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.clock.Set(now)
			got := h.post(garbage, tc.header)
			h.expect(got, 400, tc.code)
			msg := fmt.Sprint(got.Body["error"])
			if tc.code != "invalid_event" && (strings.Contains(msg, "JSON") || strings.Contains(msg, "character") || strings.Contains(msg, "mode")) {
				t.Errorf("the answer to an unverified body talks about its content or the modes: %s", msg)
			}
			h.storesNothing()
		})
	}
}

// Whatever modes have secrets, a request whose signature matches none gets the same answer:
// invalid_signature with the same message, so an unsigned caller cannot tell which modes are
// configured (there is no no_secret_for_mode any more).
func TestReceiveUnknownSecretAnswerIsTheSameForEveryConfiguration(t *testing.T) {
	t.Parallel()
	now := time.Now()
	live := stripeevents.SubscriptionEvent("evt_l", effectType, now, true, stripeevents.Subscription{ID: "sub_l", Status: "active"})
	test := subEvent("evt_t", now)
	configs := []struct {
		name       string
		test, live []string
	}{
		{"both modes", []string{testSecret}, []string{liveSecret}},
		{"test secrets only", []string{testSecret, testSecretOld}, nil},
		{"live secrets only", nil, []string{liveSecret}},
		{"no secret", nil, nil},
	}
	requests := []struct {
		name    string
		payload []byte
		secret  string
	}{
		{"live event, unknown secret", live, "whsec_unknown"},
		{"test event, unknown secret", test, "whsec_unknown"},
		{"live event, a live secret not configured here", live, "whsec_live_elsewhere"},
	}
	var first map[string]any
	for _, cfg := range configs {
		h := newHarnessWithSecrets(t, cfg.test, cfg.live)
		h.clock.Set(now)
		for _, r := range requests {
			got := h.post(r.payload, stripeevents.SignatureHeader(r.payload, r.secret, now))
			if got.Status != 400 || got.errorCode() != "invalid_signature" {
				t.Fatalf("%s, %s: got %d %v, want 400 invalid_signature", cfg.name, r.name, got.Status, got.Body)
			}
			if first == nil {
				first = got.Body
			} else if !reflect.DeepEqual(got.Body, first) {
				t.Errorf("%s, %s: answer %v differs from %v", cfg.name, r.name, got.Body, first)
			}
		}
		// A configured secret of one mode is still checked when the other mode has none.
		if cfg.name == "test secrets only" {
			got := h.post(live, stripeevents.SignatureHeader(live, liveSecret, now))
			if got.Status != 400 || got.errorCode() != "invalid_signature" {
				t.Errorf("%s: live secret of another service: %d %v, want 400 invalid_signature", cfg.name, got.Status, got.Body)
			}
		}
		h.storesNothing()
	}
}

// The mode of an event is the mode of the secret that verified it: a test-mode secret never gets
// a live-mode event stored, nor the reverse.
func TestReceiveLivemodeMustMatchTheVerifyingSecret(t *testing.T) {
	t.Parallel()
	now := time.Now()
	live := stripeevents.SubscriptionEvent("evt_live", effectType, now, true, stripeevents.Subscription{ID: "sub_l", Status: "active"})
	test := subEvent("evt_test", now)
	sign := stripeevents.SignatureHeader
	t.Run("rejected", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name    string
			payload []byte
			header  string
		}{
			{"live event signed with the current test secret", live, sign(live, testSecret, now)},
			{"live event signed with the previous test secret", live, sign(live, testSecretOld, now)},
			{"test event signed with the live secret", test, sign(test, liveSecret, now)},
		} {
			h := newHarness(t)
			h.clock.Set(now)
			got := h.post(tc.payload, tc.header)
			if got.Status != 400 || got.errorCode() != "livemode_mismatch" {
				t.Errorf("%s: got %d %v, want 400 livemode_mismatch", tc.name, got.Status, got.Body)
			}
			h.storesNothing()
		}
	})
	t.Run("only test secrets configured", func(t *testing.T) {
		t.Parallel()
		h := newHarnessWithSecrets(t, []string{testSecret}, nil)
		h.clock.Set(now)
		h.expect(h.post(live, sign(live, testSecret, now)), 400, "livemode_mismatch")
		h.storesNothing()
	})
	t.Run("only live secrets configured", func(t *testing.T) {
		t.Parallel()
		h := newHarnessWithSecrets(t, nil, []string{liveSecret})
		h.clock.Set(now)
		h.expect(h.post(test, sign(test, liveSecret, now)), 400, "livemode_mismatch")
		h.storesNothing()
	})
	// A header may carry signatures of both modes; the event is then stored in its own mode,
	// which one of them verified.
	t.Run("signatures of both modes", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		h.clock.Set(now)
		header := sign(live, liveSecret, now) + ",v1=" + strings.SplitN(sign(live, testSecret, now), "v1=", 2)[1]
		got := h.post(live, header)
		if got.Status != 200 || got.Body["status"] != "received" {
			t.Fatalf("got %d %v, want 200 received", got.Status, got.Body)
		}
		if n := h.count(`SELECT count(*) FROM webhook_events WHERE event_id = 'evt_live' AND livemode`); n != 1 {
			t.Errorf("%d live rows for evt_live, want 1", n)
		}
	})
}

// A signed body that encoding/json and PostgreSQL's jsonb would read differently is refused.
func TestReceiveRejectsAmbiguousJSON(t *testing.T) {
	t.Parallel()
	now := time.Now()
	base := subEvent("evt_amb", now) // {"api_version":…,"id":"evt_amb",…,"type":"customer.subscription.updated"}
	if !strings.HasPrefix(string(base), `{"api_version"`) {
		t.Fatalf("unexpected event layout: %.40s", base)
	}
	// with returns base with members added first, before the event's own.
	with := func(members string) []byte { return append([]byte("{"+members+","), base[1:]...) }
	deep := `"deep":` + strings.Repeat("[", 70) + strings.Repeat("]", 70)
	tests := []struct {
		name    string
		payload []byte
		code    string
		keys    []string // named in the message
	}{
		{"type and TYPE", with(`"TYPE":"invoice.payment_failed"`), "ambiguous_json", []string{"TYPE", "type"}},
		{"duplicate id", with(`"id":"evt_other"`), "ambiguous_json", []string{"id"}},
		{"Livemode and livemode", with(`"Livemode":true`), "ambiguous_json", []string{"Livemode", "livemode"}},
		{"escaped duplicate of type", with(`"\u0074ype":"invoice.payment_failed"`), "ambiguous_json", []string{"type"}},
		{"Kelvin sign", append([]byte(strings.TrimSuffix(string(base), "}")), ",\"\u212aey\":1,\"key\":2}"...), "ambiguous_json", []string{"key"}},
		{"duplicate inside data.object", []byte(strings.Replace(string(base), `"object":{`, `"object":{"ID":"sub_other",`, 1)), "ambiguous_json", []string{"ID", "id"}},
		{"a second value after the event", append(append([]byte{}, base...), " {}"...), "invalid_event", nil},
		{"garbage after the event", append(append([]byte{}, base...), "x"...), "invalid_event", nil},
		{"nested too deep", with(deep), "invalid_event", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.clock.Set(now)
			got := h.post(tc.payload, stripeevents.SignatureHeader(tc.payload, testSecret, now))
			h.expect(got, 400, tc.code)
			msg := fmt.Sprint(got.Body["error"])
			for _, k := range tc.keys {
				if !strings.Contains(msg, fmt.Sprintf("%q", k)) {
					t.Errorf("message %s does not name key %q", msg, k)
				}
			}
			h.storesNothing()
		})
	}
	// The same event without the added member is stored.
	h := newHarness(t)
	h.clock.Set(now)
	if got := h.post(base, stripeevents.SignatureHeader(base, testSecret, now)); got.Status != 200 || got.Body["status"] != "received" {
		t.Fatalf("the unambiguous event: %d %v", got.Status, got.Body)
	}
}
