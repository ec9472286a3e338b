package entitlements

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"billing/billing"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
	"billing/webhooks"
)

// featuresEnv is an env whose service reads active entitlements from a stateful Stripe account.
type featuresEnv struct {
	*env
	proxy *stripeemu.Proxy
	acct  *stripeemu.Account
}

func newFeaturesEnv(t *testing.T) *featuresEnv {
	t.Helper()
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	acct := stripeemu.NewAccount(proxy, false)
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(proxy.URL), MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	api := &client.API{}
	api.Init("sk_test_features", &stripe.Backends{API: backend})
	e := newEnv(t, func(d *Deps, _ *billing.Deps) {
		d.Read = ReadDeps{Stripe: api.EntitlementsActiveEntitlements}
	})
	return &featuresEnv{env: e, proxy: proxy, acct: acct}
}

// featureReads returns the queued reads of active entitlements.
func (e *env) featureReads(t *testing.T) []FeaturesReadArgs {
	t.Helper()
	var raws []string
	if err := e.db.Raw(`SELECT args::text FROM river_job WHERE kind = $1 ORDER BY id`, FeaturesReadJobKind).Scan(&raws).Error; err != nil {
		t.Fatal(err)
	}
	out := make([]FeaturesReadArgs, len(raws))
	for i, raw := range raws {
		if err := json.Unmarshal([]byte(raw), &out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// runFeatureReads works every queued read, as the worker would.
func (e *env) runFeatureReads(t *testing.T) {
	t.Helper()
	for _, a := range e.featureReads(t) {
		if _, err := e.svc.ReadFeatures(context.Background(), a); err != nil {
			t.Fatalf("read features of %s: %v", a.StripeCustomerID, err)
		}
	}
}

func (e *env) features(t *testing.T, userID string) []string {
	t.Helper()
	ent, err := e.svc.Entitlement(context.Background(), userID)
	if err != nil {
		t.Fatalf("entitlement of %s: %v", userID, err)
	}
	if ent.Features == nil {
		t.Fatalf("entitlement of %s: features null, want a list", userID)
	}
	return ent.Features
}

func (e *env) feature(t *testing.T, userID, key string) (int, FeatureAnswer) {
	t.Helper()
	var a FeatureAnswer
	code, _ := e.get(t, "/v1/customers/"+userID+"/features/"+key, &a)
	return code, a
}

func keysN(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("feature_%02d", i)
	}
	return keys
}

var activeSub = subObj{ID: "sub_1", Customer: "cus_1", Status: billing.StatusActive, Price: "price_pro", PeriodStart: 1, PeriodEnd: 30 * 86400, Quantity: 1}

// A summary whose list has more than its page: what it lists is granted at once, and the job
// reads every page (three of ten) and grants all 25.
func TestSummaryWithMoreIsReadPageByPage(t *testing.T) {
	t.Parallel()
	e := newFeaturesEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	e.mustHandle(t, created("s1", 1, activeSub))
	all := keysN(25)
	// Stripe's order is not the answer's: the answer is sorted.
	stripeOrder := slices.Clone(all)
	slices.Reverse(stripeOrder)
	e.acct.SetActiveEntitlements("cus_1", stripeOrder...)
	e.acct.SetEntitlementPageSize(10)
	obj, _ := json.Marshal(e.acct.ActiveEntitlementSummary("cus_1", 10))
	e.mustHandle(t, event("ent1", EventEntitlementSummaryUpdated, 10, obj))

	first := sortedCopy(stripeOrder[:10])
	if got := e.features(t, "u1"); !slices.Equal(got, first) {
		t.Fatalf("before the read: features %v, want the event's %v", got, first)
	}
	reads := e.featureReads(t)
	if len(reads) != 1 || reads[0].StripeCustomerID != "cus_1" || reads[0].EventID != "ent1" {
		t.Fatalf("queued reads %+v, want one for cus_1 by ent1", reads)
	}
	if n := len(e.proxy.Filter(http.MethodGet, "/v1/entitlements/active_entitlements")); n != 0 {
		t.Fatalf("%d reads of Stripe inside the event's transaction", n)
	}

	e.clock.Set(at(11))
	e.runFeatureReads(t)
	if got := e.features(t, "u1"); !slices.Equal(got, all) {
		t.Fatalf("after the read: features %v, want all 25 %v", got, all)
	}
	reqs := e.proxy.Filter(http.MethodGet, "/v1/entitlements/active_entitlements")
	if len(reqs) != 3 || e.acct.Stats().EntitlementPages != 3 {
		t.Fatalf("%d requests, %d pages; want the 3 pages of 10", len(reqs), e.acct.Stats().EntitlementPages)
	}
	for i, r := range reqs {
		if r.Query.Get("customer") != "cus_1" || (i > 0) != (r.Query.Get("starting_after") != "") {
			t.Errorf("request %d: %v", i, r.Query)
		}
	}
	code, a := e.feature(t, "u1", "feature_24")
	if code != http.StatusOK || !a.Allowed || a.UserID != "u1" || a.Feature != "feature_24" || !strings.HasPrefix(a.Reason, "Allowed: ") {
		t.Errorf("feature_24 (past the event's page): %d %+v", code, a)
	}
}

// While the read is pending, what was granted before stays granted (no flicker); the read then
// removes what Stripe no longer lists.
func TestSummaryWithMoreKeepsWhatWasGrantedUntilTheRead(t *testing.T) {
	t.Parallel()
	e := newFeaturesEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	e.mustHandle(t, created("s1", 1, activeSub), summaryEv("ent1", 5, "cus_1", false, "old_a", "kept"))
	e.acct.SetActiveEntitlements("cus_1", "kept", "new_b", "new_c")
	e.mustHandle(t, summaryEv("ent2", 10, "cus_1", true, "new_b"))
	if got, want := e.features(t, "u1"), []string{"kept", "new_b", "old_a"}; !slices.Equal(got, want) {
		t.Fatalf("pending: features %v, want %v", got, want)
	}
	e.clock.Set(at(12))
	e.runFeatureReads(t)
	if got, want := e.features(t, "u1"), []string{"kept", "new_b", "new_c"}; !slices.Equal(got, want) {
		t.Fatalf("after the read: features %v, want %v", got, want)
	}
}

// An older summary delivered after a newer one changes nothing, and asks for no read.
func TestOlderSummaryAfterNewerChangesNothing(t *testing.T) {
	t.Parallel()
	e := newFeaturesEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	e.mustHandle(t, created("s1", 1, activeSub),
		summaryEv("new", 200, "cus_1", false, "b", "a"),
		summaryEv("old", 100, "cus_1", false, "c"),
		summaryEv("old_more", 150, "cus_1", true, "d"))
	if got := e.features(t, "u1"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("features %v, want the newer summary's [a b]", got)
	}
	if reads := e.featureReads(t); len(reads) != 0 {
		t.Errorf("reads queued by stale summaries: %+v", reads)
	}
	// The same order delivered the other way round ends the same.
	e2 := newFeaturesEnv(t)
	e2.link(t, "u1", "cus_1", "u1@example.com")
	e2.mustHandle(t, created("s1", 1, activeSub),
		summaryEv("old", 100, "cus_1", false, "c"),
		summaryEv("new", 200, "cus_1", false, "b", "a"))
	if got := e2.features(t, "u1"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("in order: features %v, want [a b]", got)
	}
}

// A read is fresher than the events before its fetch, but an event newer than the fetch is not
// undone by it; an event of the read's own second cannot be ordered against it, and asks for a
// read of its own.
func TestReadsAreOrderedAgainstEvents(t *testing.T) {
	t.Parallel()
	e := newFeaturesEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	e.mustHandle(t, created("s1", 1, activeSub))
	e.acct.SetActiveEntitlements("cus_1", "read")

	// The read fetched in the second of the event that asked for it still wins over that event.
	e.mustHandle(t, summaryEv("e100", 100, "cus_1", true, "event"))
	e.clock.Set(at(100))
	e.runFeatureReads(t)
	if got := e.features(t, "u1"); !slices.Equal(got, []string{"read"}) {
		t.Fatalf("read of the event's second: features %v, want the read's", got)
	}

	// An event of the read's second, applied after it: stale by the key, settled by a new read.
	e.acct.SetActiveEntitlements("cus_1", "settled")
	e.mustHandle(t, summaryEv("e100b", 100, "cus_1", false, "same_second"))
	if got := e.features(t, "u1"); !slices.Equal(got, []string{"read"}) {
		t.Fatalf("tie: features %v, want the read's until Stripe is asked", got)
	}
	reads := e.featureReads(t)
	if len(reads) != 2 || reads[1].EventID != "e100b" {
		t.Fatalf("reads %+v, want a second one for the tie", reads)
	}
	if _, err := e.svc.ReadFeatures(context.Background(), reads[1]); err != nil {
		t.Fatal(err)
	}
	if got := e.features(t, "u1"); !slices.Equal(got, []string{"settled"}) {
		t.Fatalf("after the tie's read: features %v, want Stripe's", got)
	}

	// A newer event, then a read fetched before it: the read changes nothing.
	e.mustHandle(t, summaryEv("e300", 300, "cus_1", true, "newest"))
	e.acct.SetActiveEntitlements("cus_1", "stale_read")
	e.clock.Set(at(200))
	if _, err := e.svc.ReadFeatures(context.Background(), FeaturesReadArgs{StripeCustomerID: "cus_1", EventID: "e150", EventCreated: base + 150}); err != nil {
		t.Fatal(err)
	}
	if got := e.features(t, "u1"); !slices.Equal(got, []string{"newest", "settled"}) {
		t.Fatalf("an older read after a newer event: features %v, want the event's (with what it kept)", got)
	}
}

// A hold withholds the features (access stays under past_due_entitled), the payment restores
// them; the feature answer says why.
func TestHoldGatesFeatures(t *testing.T) {
	t.Parallel()
	e := newFeaturesEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	e.mustHandle(t, created("s1", 1, activeSub), summaryEv("ent1", 2, "cus_1", false, "pro", "export"))
	if got := e.features(t, "u1"); !slices.Equal(got, []string{"export", "pro"}) {
		t.Fatalf("features %v", got)
	}
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", AttemptCount: 1, AmountDue: 900, Currency: "usd", Created: 10}
	e.mustHandle(t, failed("f1", 10, inv), updated("u_past_due", 10, activeSub.With(billing.StatusPastDue)))
	ent, err := e.svc.Entitlement(context.Background(), "u1")
	if err != nil {
		t.Fatal(err)
	}
	if !ent.Entitled || !ent.OnHold || len(ent.Features) != 0 || ent.Features == nil {
		t.Fatalf("on hold: entitled %v on_hold %v features %v; want entitled, on hold, []", ent.Entitled, ent.OnHold, ent.Features)
	}
	code, a := e.feature(t, "u1", "pro")
	if code != http.StatusOK || a.Allowed || !strings.Contains(a.Reason, "on hold") {
		t.Errorf("pro on hold: %d %+v", code, a)
	}
	e.mustHandle(t, succeeded("p1", 20, inv), updated("u_active", 20, activeSub))
	if got := e.features(t, "u1"); !slices.Equal(got, []string{"export", "pro"}) {
		t.Fatalf("after the payment: features %v, want them back", got)
	}
	if _, a := e.feature(t, "u1", "pro"); !a.Allowed {
		t.Errorf("pro after the payment: %+v", a)
	}
}

// Features follow access: none without an entitled subscription, none after a renewal that
// Stripe did not confirm.
func TestFeaturesFollowAccess(t *testing.T) {
	t.Parallel()
	e := newFeaturesEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	e.mustHandle(t, summaryEv("ent1", 2, "cus_1", false, "pro"))
	if got := e.features(t, "u1"); len(got) != 0 {
		t.Errorf("no subscription: features %v", got)
	}
	if _, a := e.feature(t, "u1", "pro"); a.Allowed || !strings.Contains(a.Reason, "no subscription") {
		t.Errorf("no subscription: %+v", a)
	}
	e.mustHandle(t, created("s1", 3, activeSub))
	if got := e.features(t, "u1"); !slices.Equal(got, []string{"pro"}) {
		t.Errorf("active: features %v", got)
	}
	// Past the period end and the grace, with no renewal: access and features end.
	e.clock.Set(at(30*86400 + 3*3600))
	if got := e.features(t, "u1"); len(got) != 0 {
		t.Errorf("unconfirmed renewal: features %v", got)
	}
	if _, a := e.feature(t, "u1", "pro"); a.Allowed || !strings.Contains(a.Reason, "no renewal") {
		t.Errorf("unconfirmed renewal: %+v", a)
	}
}

func TestFeatureAnswers(t *testing.T) {
	t.Parallel()
	e := newFeaturesEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	e.mustHandle(t, created("s1", 1, activeSub), summaryEv("ent1", 2, "cus_1", false, "pro"))

	if code, body := e.get(t, "/v1/customers/nobody/features/pro", nil); code != http.StatusNotFound || !strings.Contains(string(body), `"not_found"`) {
		t.Errorf("unknown user: %d %s", code, body)
	}
	for _, key := range []string{strings.Repeat("k", 201), "a%00b", "a%0Ab"} {
		if code, body := e.get(t, "/v1/customers/u1/features/"+key, nil); code != http.StatusBadRequest || !strings.Contains(string(body), `"invalid_lookup_key"`) {
			t.Errorf("key %.20q: %d %s, want 400 invalid_lookup_key", key, code, body)
		}
	}
	code, a := e.feature(t, "u1", "enterprise")
	if code != http.StatusOK || a.Allowed || !strings.Contains(a.Reason, "not among") {
		t.Errorf("unlisted: %d %+v", code, a)
	}
	// The fast encoder answers what encoding/json would (?pretty goes through it).
	_, fast := e.get(t, "/v1/customers/u1/features/pro", nil)
	var viaJSON FeatureAnswer
	if err := json.Unmarshal(fast, &viaJSON); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(viaJSON)
	if strings.TrimSpace(string(fast)) != string(want) || !viaJSON.Allowed {
		t.Errorf("answer %s, want %s", fast, want)
	}
}

// The seats follow the subscription's events, ordered like every other column of the snapshot.
func TestQuantityFollowsTheEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	s := activeSub
	s.Quantity = 3
	e.mustHandle(t, created("s1", 1, s))
	quantity := func() string {
		ent, err := e.svc.Entitlement(context.Background(), "u1")
		if err != nil {
			t.Fatal(err)
		}
		return ptrInt(ent.Quantity)
	}
	if q := quantity(); q != "3" {
		t.Fatalf("quantity %s, want 3", q)
	}
	s.Quantity = 5
	e.mustHandle(t, updated("u5", 10, s))
	s.Quantity = 2
	e.mustHandle(t, updated("u2_old", 5, s))
	if q := quantity(); q != "5" {
		t.Fatalf("quantity %s after an older event, want the newer 5", q)
	}
	if v := e.customerView(t, "u1"); ptrInt(v.Subscriptions[0].Quantity) != "5" || ptrInt(v.Entitlement.Quantity) != "5" {
		t.Errorf("customer view: %+v", v)
	}
}

// A summary of the other mode's customer, or one the database cannot keep, is refused.
func TestSummaryRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, obj := range []string{`[]`, `{"object":"entitlements.active_entitlement_summary"}`,
		`{"object":"entitlements.active_entitlement_summary","customer":"cus_1"}`,
		`{"object":"entitlements.active_entitlement_summary","customer":"cus_1","entitlements":{"data":[{"lookup_key":""}]}}`} {
		err := e.handle(t, event("bad", EventEntitlementSummaryUpdated, 1, json.RawMessage(obj)))
		if err == nil || !webhooks.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent failure", obj, err)
		}
	}
	var n int64
	if err := e.db.Raw(`SELECT count(*) FROM customer_features WHERE livemode = false`).Scan(&n).Error; err != nil || n != 0 {
		t.Errorf("%d rows stored (%v)", n, err)
	}
}
