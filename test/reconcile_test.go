package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/testenv"
)

// A storm in which a random 10% of the events never arrive (none of their deliveries is sent),
// then `billing reconcile` against Stripe's truth (the double, holding each subscription as its
// newest event left it): afterwards every subscription is what its events, all of them, say, and
// a dry run finds nothing.
func TestStormWithDroppedEventsThenReconcile(t *testing.T) {
	t.Parallel()
	seed := relSeed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	url := testenv.DatabaseURL(t)
	db := openDB(t, url)
	plan := genPlan(rng, "dropped", stormSubs, stormEvents)
	linkUsers(t, db, plan, 8)
	dropped := map[*relEvent]bool{}
	for _, ev := range plan.Events {
		if rng.IntN(10) == 0 {
			dropped[ev] = true
		}
	}
	var deliveries []*relEvent
	for _, ev := range plan.deliveries(rng) {
		if !dropped[ev] {
			deliveries = append(deliveries, ev)
		}
	}

	svc := newService(t, "replica", relEnv(t, url))
	s := newSenders(plan, []string{svc.url("")})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	select {
	case <-s.run(ctx, deliveries, stormSenders):
	case <-time.After(5 * time.Minute):
		t.Fatalf("senders still running after 5 minutes: %s", s.stats)
	}
	waitDrained(t, db, 3*time.Minute)
	behind := wrongStates(t, db, plan)
	t.Logf("%d of %d events dropped; %d of %d subscriptions behind Stripe before reconcile", len(dropped), len(plan.Events), behind, len(plan.Subs))
	if behind == 0 {
		t.Fatalf("seed %d dropped nothing that mattered: the test would prove nothing", seed)
	}

	// Stripe's truth: each subscription as its newest subscription event shows it, with its
	// newest invoice, as the newest event about it shows it, as latest_invoice.
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	acct := stripeemu.NewAccount(proxy, false)
	for _, sub := range plan.Subs {
		acct.PutSubscriptionJSON(truthOf(t, sub))
	}
	env := relEnv(t, url)
	env["BILLING_STRIPE_API_URL"] = proxy.URL
	code, out := runCmd(t, t.TempDir(), env, "reconcile")
	sum, line := summaryOf(t, out)
	t.Logf("billing reconcile: exit %d, %s", code, line)
	if code != 0 || sum["objects"] != len(plan.Subs) || sum["drifted"] < behind || sum["repaired"] != sum["drifted"] || sum["errors"] != 0 {
		t.Fatalf("billing reconcile: exit %d, %s; want exit 0, objects=%d, every drifted one (at least %d) repaired\n%s",
			code, line, len(plan.Subs), behind, tail(out, 4000))
	}
	if n := wrongStates(t, db, plan); n != 0 {
		t.Fatalf("%d subscriptions still differ from Stripe after reconcile", n)
	}
	code, out = runCmd(t, t.TempDir(), env, "reconcile", "--dry-run")
	if sum, line := summaryOf(t, out); code != 0 || sum["drifted"] != 0 {
		t.Fatalf("dry run after the repair: exit %d, %s", code, line)
	}
}

// wrongStates counts the subscriptions whose status or payment hold is not what all their events
// say (a subscription with no row counts).
func wrongStates(t *testing.T, db *sql.DB, plan *relPlan) int {
	t.Helper()
	n := 0
	for _, sub := range plan.Subs {
		want := sub.expected()
		var status string
		var hold bool
		err := db.QueryRow(`SELECT status, payment_hold FROM subscriptions WHERE subscription_id = $1`, sub.ID).Scan(&status, &hold)
		switch {
		case err == sql.ErrNoRows:
			n++
		case err != nil:
			t.Fatal(err)
		case status != want.Status || (want.InvEventID != "" && hold != want.PaymentHold):
			n++
		}
	}
	return n
}

// truthOf is a subscription as Stripe holds it after all its events.
func truthOf(t *testing.T, sub *relSub) json.RawMessage {
	t.Helper()
	var subObj, invObj map[string]any
	var subAt, invAt, invCreated time.Time
	for _, ev := range sub.Events {
		var env struct {
			Data struct {
				Object map[string]any `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal(ev.Body, &env); err != nil {
			t.Fatal(err)
		}
		if ev.isInvoice() {
			// Stripe's latest_invoice is the newest invoice, whatever the order of the events
			// about older ones (a late payment of an older invoice comes after the newer one).
			newer := invObj == nil || ev.InvoiceCreated.After(invCreated) ||
				(ev.InvoiceCreated.Equal(invCreated) && ev.Created.After(invAt))
			if newer {
				invObj, invAt, invCreated = env.Data.Object, ev.Created, ev.InvoiceCreated
			}
		} else if subObj == nil || ev.Created.After(subAt) {
			subObj, subAt = env.Data.Object, ev.Created
		}
	}
	if invObj != nil {
		subObj["latest_invoice"] = invObj
	}
	b, err := json.Marshal(subObj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var summaryLine = regexp.MustCompile(`(?m)^reconcile: objects=(\d+) drifted=(\d+) repaired=(\d+) missing_at_stripe=(\d+) errors=(\d+)(?: catalog_objects=\d+ catalog_drifted=\d+ catalog_repaired=\d+)?$`)

// summaryOf finds the one summary line in a command's output.
func summaryOf(t *testing.T, out string) (map[string]int, string) {
	t.Helper()
	all := summaryLine.FindAllStringSubmatch(out, -1)
	if len(all) != 1 {
		t.Fatalf("%d summary lines in the output, want 1:\n%s", len(all), tail(out, 4000))
	}
	m := all[0]
	sum := map[string]int{}
	for i, k := range []string{"objects", "drifted", "repaired", "missing_at_stripe", "errors"} {
		sum[k], _ = strconv.Atoi(m[i+1])
	}
	return sum, m[0]
}
