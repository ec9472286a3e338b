package test

// The harness of the reliability tests (reliability_test.go): a plan of realistic Stripe event
// sequences with the state each subscription must end in, senders that deliver like Stripe does
// (concurrently, shuffled, duplicated, retrying every non-200), `billing serve` replicas that the
// test kills and restarts on the same address, and the checks that turn the outcome into figures.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"billing/internal/pgcluster"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

const (
	relSecret     = "whsec_reliability_0123456789abcdef0123456789abcdef"
	relAPIToken   = "app-reliability-0123456789abcdef0123"
	relAdminToken = "admin-reliability-0123456789abcdef01"

	evCreated      = "customer.subscription.created"
	evUpdated      = "customer.subscription.updated"
	evDeleted      = "customer.subscription.deleted"
	evTrialWillEnd = "customer.subscription.trial_will_end"
	evPayFailed    = "invoice.payment_failed"
	evPaySucceeded = "invoice.payment_succeeded"
	// The newer types the service handles.
	evActionRequired  = "invoice.payment_action_required"
	evPaid            = "invoice.paid"
	evPaused          = "customer.subscription.paused"
	evResumed         = "customer.subscription.resumed"
	evCustomerUpdated = "customer.updated"

	noticeTrial          = "trial_will_end"
	noticePayment        = "payment_failed"
	noticeActionRequired = "payment_action_required"

	holdPaymentFailed = "payment_failed"
	holdAuthRequired  = "authentication_required"
)

// relSeed is the seed of a test's randomness: RELIABILITY_SEED reproduces a run.
func relSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RELIABILITY_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("RELIABILITY_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (set RELIABILITY_SEED=%d to replay this run)", seed, seed)
	return seed
}

// relEnv is the configuration of a service under test on database url.
func relEnv(t *testing.T, url string) map[string]string {
	t.Helper()
	return map[string]string{
		"BILLING_DATABASE_URL":                url,
		"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": relSecret,
		"BILLING_STRIPE_API_URL":              testenv.StripeMockURL(t),
		"BILLING_STRIPE_SECRET_KEY":           "sk_test_reliability",
		"BILLING_AUTH_API_TOKENS":             relAPIToken,
		"BILLING_AUTH_ADMIN_TOKENS":           relAdminToken,
		"BILLING_WORKER_RETRY_DELAY":          "10ms",
		"BILLING_WORKER_RESCUE_AFTER":         "2s",
	}
}

func openDB(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// ---------------------------------------------------------------------------------------------
// The plan: event sequences and what they must leave behind.

type relEvent struct {
	idx     int
	ID      string
	Type    string
	Created time.Time
	Sub     *relSub
	// Status is the snapshot's status (subscription events).
	Status string
	// PauseCollection: the snapshot has pause_collection set (subscription events).
	PauseCollection bool
	// InvoiceID and InvoiceCreated are the invoice of an invoice event and its own creation: a
	// payment lifts a hold only when its invoice is the held one or newer.
	InvoiceID      string
	InvoiceCreated time.Time
	// Email and Name are a customer.updated's customer (Name nil: Stripe's null).
	Email string
	Name  *string
	Body  []byte
}

func (e *relEvent) isInvoice() bool {
	switch e.Type {
	case evPayFailed, evActionRequired, evPaySucceeded, evPaid:
		return true
	}
	return false
}

func (e *relEvent) isCustomer() bool { return e.Type == evCustomerUpdated }

// holds reports whether an invoice event starts (or keeps) a payment hold; the other invoice
// events of the plan are payments, which lift it.
func (e *relEvent) holds() bool { return e.Type == evPayFailed || e.Type == evActionRequired }

// holdKind is the hold reason an invoice event that holds gives, and the notice it calls for.
func holdKind(typ string) (reason, notice string) {
	if typ == evActionRequired {
		return holdAuthRequired, noticeActionRequired
	}
	return holdPaymentFailed, noticePayment
}

type relSub struct {
	ID, Customer string
	// User is set for subscriptions whose customer the test links (customers table).
	User   string
	Events []*relEvent // subscription and invoice events, in Stripe's order (created ascending)
	// CustomerEvents are the customer.updated of its customer, in Stripe's order.
	CustomerEvents []*relEvent
}

type relPlan struct {
	Subs   []*relSub
	Events []*relEvent
}

func terminal(status string) bool { return status == "canceled" || status == "incomplete_expired" }

// withObjectFields sets fields of an event's data.object (what stripeevents does not build).
func withObjectFields(body []byte, fields map[string]any) []byte {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // timestamps and amounts stay integers
	var ev map[string]any
	if err := dec.Decode(&ev); err != nil {
		panic(fmt.Sprintf("decode a built event: %v", err))
	}
	obj := ev["data"].(map[string]any)["object"].(map[string]any)
	maps.Copy(obj, fields)
	out, err := json.Marshal(ev)
	if err != nil {
		panic(fmt.Sprintf("encode an event: %v", err))
	}
	return out
}

// genPlan makes at least minSubs subscriptions and minEvents events. Every subscription runs a
// plausible lifecycle (trial, conversion, renewals, failed payments and their retries, payments
// that need the customer's authentication, dunning to unpaid, a trial paused for want of a
// payment method and resumed, collection paused and resumed, cancellation), and some customers
// change their email or name; its events have distinct `created` seconds, so the newest event of
// each kind is unambiguous and the expected final state does not depend on the tie rule.
func genPlan(rng *rand.Rand, run string, minSubs, minEvents int) *relPlan {
	plan := &relPlan{}
	// Recent enough that every period and trial is still running now, as it would be for events
	// Stripe is delivering: an entitled subscription whose period ended long ago without a
	// renewal is not entitled any more (time-aware entitlement), and an ended trial gets no
	// "your trial ends" mail.
	// Subscriptions start an hour apart, closer for big plans, so that every event is in the past
	// too: Stripe sends none from the future, and a read of Stripe (reconcile's) must be newer
	// than every event it is to correct.
	start := time.Now().Add(-72 * time.Hour).Truncate(time.Second)
	spacing := min(time.Hour, 70*time.Hour/time.Duration(max(minSubs, minEvents/4, 1)))
	for i := 0; len(plan.Subs) < minSubs || len(plan.Events) < minEvents; i++ {
		s := &relSub{ID: fmt.Sprintf("sub_%s_%03d", run, i), Customer: fmt.Sprintf("cus_%s_%03d", run, i)}
		clock := start.Add(time.Duration(i) * spacing)
		subStart := clock
		periodStart := clock
		invoiceN, attempt := 0, 0
		invoice := ""
		var invoiceCreated time.Time
		collectionPaused := false
		tick := func() time.Time {
			clock = clock.Add(time.Duration(1+rng.IntN(120)) * time.Second)
			return clock
		}
		nextID := func() string {
			return fmt.Sprintf("evt_%s_%03d_%02d", run, i, len(s.Events)+len(s.CustomerEvents))
		}
		emitInvoice := func(typ, id string, created time.Time, attempt int) {
			at := tick()
			ev := &relEvent{ID: nextID(), Type: typ, Created: at, Sub: s, InvoiceID: id, InvoiceCreated: created}
			inv := stripeevents.Invoice{
				ID: id, Customer: s.Customer, Subscription: s.ID, CustomerEmail: "billing+" + s.ID + "@example.com",
				AttemptCount: attempt, AmountDue: 2000, Currency: "usd",
				HostedInvoiceURL: "https://invoice.stripe.com/i/acct_test/" + id,
			}
			if ev.holds() {
				inv.Status, inv.NextPaymentAttempt = "open", at.Add(72*time.Hour)
			} else {
				inv.Status, inv.AmountPaid = "paid", 2000
			}
			ev.Body = withObjectFields(stripeevents.InvoiceEvent(ev.ID, typ, at, false, inv),
				map[string]any{"created": created.Unix()})
			s.Events = append(s.Events, ev)
		}
		emit := func(typ, status string) {
			if strings.HasPrefix(typ, "invoice.") {
				emitInvoice(typ, invoice, invoiceCreated, attempt)
				return
			}
			at := tick()
			ev := &relEvent{ID: nextID(), Type: typ, Created: at, Sub: s, Status: status, PauseCollection: collectionPaused}
			snap := stripeevents.Subscription{
				ID: s.ID, Customer: s.Customer, Status: status, PriceID: "price_monthly",
				CurrentPeriodStart: periodStart, CurrentPeriodEnd: periodStart.AddDate(0, 1, 0),
			}
			if status == "trialing" {
				snap.TrialStart, snap.TrialEnd = subStart, subStart.AddDate(0, 0, 14)
				snap.CurrentPeriodEnd = snap.TrialEnd
			}
			if terminal(status) {
				snap.CanceledAt, snap.EndedAt = at, at
			}
			ev.Body = stripeevents.SubscriptionEvent(ev.ID, typ, at, false, snap)
			if collectionPaused {
				// Stripe keeps sending pause_collection with every snapshot until collection resumes.
				ev.Body = withObjectFields(ev.Body, map[string]any{"pause_collection": map[string]any{
					"behavior": "void", "resumes_at": periodStart.AddDate(0, 1, 0).Unix()}})
			}
			s.Events = append(s.Events, ev)
		}
		newInvoice := func() {
			invoiceN++
			invoice, attempt = fmt.Sprintf("in_%s_%03d_%d", run, i, invoiceN), 1
			invoiceCreated = clock
			periodStart = clock
		}
		// A payment: invoice.payment_succeeded, invoice.paid, or both (Stripe sends both for one
		// payment, and only paid for an invoice paid out of band).
		pay := func() {
			switch r := rng.IntN(10); {
			case r < 7:
				emit(evPaySucceeded, "")
			case r < 9:
				emit(evPaySucceeded, "")
				emit(evPaid, "")
			default:
				emit(evPaid, "")
			}
		}
		// Two events Stripe sends for one change, in either order.
		pair := func(a, b func()) {
			if rng.IntN(2) == 0 {
				a()
				b()
			} else {
				b()
				a()
			}
		}

		status := "trialing"
		switch r := rng.IntN(20); {
		case r < 9:
		case r < 17:
			status = "active"
		default:
			status = "incomplete"
		}
		emit(evCreated, status)
		if status == "active" {
			newInvoice()
			pay()
		}
		length := 4 + rng.IntN(4)
		trialNoticeSent := false
	lifecycle:
		for len(s.Events) < length {
			switch status {
			case "trialing":
				if !trialNoticeSent && rng.IntN(10) < 7 {
					emit(evTrialWillEnd, "trialing")
					trialNoticeSent = true
					continue
				}
				if rng.IntN(7) == 0 {
					// The trial ended without a payment method: Stripe pauses the subscription.
					emit(evPaused, "paused")
					status = "paused"
					continue
				}
				newInvoice()
				if rng.IntN(4) < 3 {
					pair(pay, func() { emit(evUpdated, "active") })
					status = "active"
				} else {
					pair(func() { emit(evPayFailed, "") }, func() { emit(evUpdated, "past_due") })
					status = "past_due"
				}
			case "paused":
				if rng.IntN(2) == 0 {
					break lifecycle // no payment method yet: it stays paused
				}
				// A payment method arrived: the first invoice is paid and the subscription resumes.
				newInvoice()
				pair(pay, func() { emit(evResumed, "active") })
				status = "active"
			case "active":
				if collectionPaused {
					collectionPaused = false
					emit(evUpdated, "active")
					continue
				}
				if rng.IntN(14) == 0 {
					collectionPaused = true
					emit(evUpdated, "active")
					continue
				}
				newInvoice()
				switch r := rng.IntN(20); {
				case r < 12:
					if rng.IntN(2) == 0 {
						pay()
					} else {
						pair(pay, func() { emit(evUpdated, "active") })
					}
				case r < 17:
					pair(func() { emit(evPayFailed, "") }, func() { emit(evUpdated, "past_due") })
					status = "past_due"
				default:
					// The renewal needs the customer's authentication (3-D Secure): the attempt
					// fails, sometimes reported as a failure first.
					if rng.IntN(2) == 0 {
						emit(evPayFailed, "")
					}
					pair(func() { emit(evActionRequired, "") }, func() { emit(evUpdated, "past_due") })
					status = "past_due"
				}
			case "past_due":
				if rng.IntN(5) == 0 {
					// The next period's invoice fails too, then the customer pays the older one.
					older, olderCreated, olderAttempt := invoice, invoiceCreated, attempt+1
					newInvoice()
					emit(evPayFailed, "")
					emitInvoice(evPaySucceeded, older, olderCreated, olderAttempt)
					continue
				}
				switch r := rng.IntN(20); {
				case r < 7:
					attempt++
					emit(evPayFailed, "")
				case r < 9:
					attempt++
					emit(evActionRequired, "")
				case r < 15:
					attempt++
					pair(pay, func() { emit(evUpdated, "active") })
					status = "active"
				case r < 17:
					// The next period's invoice is paid: that lifts the hold of the older one.
					newInvoice()
					pair(pay, func() { emit(evUpdated, "active") })
					status = "active"
				default:
					emit(evUpdated, "unpaid")
					status = "unpaid"
				}
			case "unpaid":
				attempt++
				pair(pay, func() { emit(evUpdated, "active") })
				status = "active"
			case "incomplete":
				if rng.IntN(5) < 4 {
					newInvoice()
					pair(pay, func() { emit(evUpdated, "active") })
					status = "active"
				} else {
					emit(evUpdated, "incomplete_expired")
					break lifecycle
				}
			}
		}
		if !terminal(status) && rng.IntN(3) == 0 {
			emit(evDeleted, "canceled")
		}
		// Some customers change their email or name (customer.updated); only a linked
		// customer's link keeps them.
		if rng.IntN(3) == 0 {
			for k := range 1 + rng.IntN(2) {
				at := tick()
				ev := &relEvent{ID: nextID(), Type: evCustomerUpdated, Created: at, Sub: s,
					Email: fmt.Sprintf("new%d+%s@example.com", k, s.ID)}
				if rng.IntN(2) == 0 {
					name := fmt.Sprintf("Customer %s %d", s.ID, k)
					ev.Name = &name
				}
				ev.Body = stripeevents.Event(ev.ID, evCustomerUpdated, at, false, map[string]any{
					"id": s.Customer, "object": "customer", "email": ev.Email, "name": ev.Name, "livemode": false,
					"metadata": map[string]any{}}, map[string]any{"email": "old@example.com"})
				s.CustomerEvents = append(s.CustomerEvents, ev)
			}
		}
		plan.Subs = append(plan.Subs, s)
		for _, ev := range append(slices.Clone(s.Events), s.CustomerEvents...) {
			ev.idx = len(plan.Events)
			plan.Events = append(plan.Events, ev)
		}
	}
	return plan
}

// linkUsers links the customers of the first n subscriptions to app users, so that their
// entitlement can be read over the API.
func linkUsers(t *testing.T, db *sql.DB, plan *relPlan, n int) []*relSub {
	t.Helper()
	var out []*relSub
	for _, s := range plan.Subs[:min(n, len(plan.Subs))] {
		s.User = "user_" + s.ID
		if _, err := db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ($1, $2, $3)`,
			s.User, s.Customer, s.User+"@example.com"); err != nil {
			t.Fatalf("link %s: %v", s.User, err)
		}
		out = append(out, s)
	}
	return out
}

// deliveries returns every event 1–3 times, shuffled.
func (p *relPlan) deliveries(rng *rand.Rand) []*relEvent {
	var out []*relEvent
	for _, ev := range p.Events {
		for range 1 + rng.IntN(3) {
			out = append(out, ev)
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// expectedSub is what a subscription's events say, by the rules of README.md and
// billing/policy.go (never by what the service happens to do).
type expectedSub struct {
	Status     string
	SubEventID string
	SubCreated time.Time
	// PauseCollection: the newest snapshot has pause_collection.
	PauseCollection bool
	PaymentHold     bool
	// HoldKind is the reason of the payment hold while PaymentHold (payment_failed or
	// authentication_required).
	HoldKind      string
	InvEventID    string // "" when the subscription had no invoice event
	InvCreated    time.Time
	InvoiceID     string
	TrialWillEnd  *time.Time
	OnHold        bool
	HoldReason    string
	Entitled      bool
	EntitleStatus string
}

func (s *relSub) expected() expectedSub {
	var e expectedSub
	// The hold's invoice: the newest invoice created among the failures since the hold began.
	var holdInvoice time.Time
	for _, ev := range s.Events {
		switch {
		case ev.isInvoice():
			// Stripe's order is the created order: an event applies when it is the newest word on
			// payments, and a payment lifts the hold only when its invoice is the held one or newer.
			if e.InvEventID != "" && !ev.Created.After(e.InvCreated) {
				continue
			}
			if ev.holds() {
				if !e.PaymentHold || ev.InvoiceCreated.After(holdInvoice) {
					holdInvoice = ev.InvoiceCreated
				}
				e.PaymentHold = true
				e.HoldKind, _ = holdKind(ev.Type)
			} else {
				if e.PaymentHold && ev.InvoiceCreated.Before(holdInvoice) {
					continue // a late payment of an older invoice leaves the newer one's hold
				}
				e.PaymentHold, e.HoldKind = false, ""
			}
			e.InvEventID, e.InvCreated, e.InvoiceID = ev.ID, ev.Created, ev.InvoiceID
		default:
			if e.SubEventID == "" || ev.Created.After(e.SubCreated) {
				e.SubEventID, e.SubCreated, e.Status, e.PauseCollection = ev.ID, ev.Created, ev.Status, ev.PauseCollection
			}
			if ev.Type == evTrialWillEnd && (e.TrialWillEnd == nil || ev.Created.After(*e.TrialWillEnd)) {
				c := ev.Created
				e.TrialWillEnd = &c
			}
		}
	}
	// The hold rules of billing/policy.go (Subscription.Hold): a terminal subscription is never on
	// hold; a payment hold is lifted by a newer snapshot in good standing; unpaid >
	// authentication_required / payment_failed (the hold's own reason) > past_due.
	paymentHold := e.PaymentHold && !((e.Status == "active" || e.Status == "trialing") && e.InvEventID != "" && e.SubCreated.After(e.InvCreated))
	switch {
	case terminal(e.Status):
	case e.Status == "unpaid":
		e.OnHold, e.HoldReason = true, "unpaid"
	case paymentHold:
		e.OnHold, e.HoldReason = true, e.HoldKind
	case e.Status == "past_due":
		e.OnHold, e.HoldReason = true, "past_due"
	}
	// Entitlement policy with the defaults: policy.past_due_entitled and
	// policy.paused_collection_entitled true, so collection paused keeps access; the status
	// paused (a trial that ended without a payment method) never does.
	e.Entitled = e.Status == "trialing" || e.Status == "active" || e.Status == "past_due"
	return e
}

// expectedCustomer is the link of a linked subscription's customer after its events: the newest
// customer.updated's email and name (null as ""), or what linkUsers wrote when none came.
func (s *relSub) expectedCustomer() (email, name, eventID string) {
	email = s.User + "@example.com"
	var newest *relEvent
	for _, ev := range s.CustomerEvents {
		if newest == nil || ev.Created.After(newest.Created) {
			newest = ev
		}
	}
	if newest == nil {
		return email, "", ""
	}
	if newest.Name != nil {
		name = *newest.Name
	}
	return newest.Email, name, newest.ID
}

// noticeModel replays the notice rules of billing/lifecycle.go over one subscription's events
// in the order the service committed them: trial_will_end sends one only if the subscription is
// still trialing once the event is applied; payment_failed and payment_action_required only if
// the event is the newest word on payments (applied) and the subscription was not terminal before
// it. Whether an invoice event applies follows the same rules as expected(): newer than the last
// applied invoice event, and for a payment, of the held invoice or a newer one.
type noticeModel struct {
	status      string
	subCreated  *time.Time
	invCreated  *time.Time
	invInvoice  time.Time // the invoice creation of the applied invoice event
	hold        bool
	holdInvoice time.Time
}

// noticeKindOf is the notice an event sends when the rules call for one.
func noticeKindOf(ev *relEvent) string {
	switch {
	case ev.isInvoice() && ev.holds():
		_, kind := holdKind(ev.Type)
		return kind
	case ev.Type == evTrialWillEnd:
		return noticeTrial
	}
	return ""
}

func (m *noticeModel) apply(ev *relEvent) (notice string) {
	if ev.isCustomer() {
		return ""
	}
	if m.status == "" {
		m.status = "incomplete" // the placeholder row of an event that comes first
	}
	if ev.isInvoice() {
		prior := m.status
		// The payment state follows the newest invoice: an event about a newer invoice wins,
		// within one invoice the newer event does (event order alone when a time is missing).
		applied := m.invCreated == nil
		if !applied {
			if !ev.InvoiceCreated.IsZero() && !m.invInvoice.IsZero() && !ev.InvoiceCreated.Equal(m.invInvoice) {
				applied = ev.InvoiceCreated.After(m.invInvoice)
			} else {
				applied = ev.Created.After(*m.invCreated)
			}
		}
		if applied && !ev.holds() && m.hold && ev.InvoiceCreated.Before(m.holdInvoice) {
			applied = false
		}
		if !applied {
			return ""
		}
		c := ev.Created
		m.invCreated, m.invInvoice = &c, ev.InvoiceCreated
		if !ev.holds() {
			m.hold = false
			return ""
		}
		if !m.hold || ev.InvoiceCreated.After(m.holdInvoice) {
			m.holdInvoice = ev.InvoiceCreated
		}
		m.hold = true
		if terminal(prior) {
			return ""
		}
		_, kind := holdKind(ev.Type)
		return kind
	}
	status := ev.Status
	if ev.Type == evDeleted && !terminal(status) {
		status = "canceled"
	}
	if (m.subCreated == nil || ev.Created.After(*m.subCreated)) && (!terminal(m.status) || terminal(status)) {
		c := ev.Created
		m.status, m.subCreated = status, &c
	}
	if ev.Type == evTrialWillEnd && m.status == "trialing" {
		return noticeTrial
	}
	return ""
}

// ---------------------------------------------------------------------------------------------
// Replicas of the service that the test kills and restarts.

// service is one `billing serve` replica on a fixed address: a restart comes back on the same
// port, so senders keep going. The logs of all its incarnations go to one buffer.
type service struct {
	t     *testing.T
	name  string
	addr  string
	dir   string
	env   map[string]string
	out   *syncBuffer
	mu    sync.Mutex
	p     *proc
	kills int
	// peakKB is the highest VmHWM (peak resident set, KiB) of the incarnations killed so far.
	peakKB int64
}

// PeakRSS is the highest peak resident set of any incarnation so far, in KiB: the killed ones'
// (read just before their kill) and the running one's.
func (s *service) PeakRSS() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	peak := s.peakKB
	if s.p != nil && s.p.cmd.Process != nil {
		peak = max(peak, procStatusKB(s.p.cmd.Process.Pid, "VmHWM"))
	}
	return peak
}

// procStatusKB reads a "<field>: N kB" line of /proc/<pid>/status (0 when unknown).
func procStatusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

func newService(t *testing.T, name string, env map[string]string) *service {
	t.Helper()
	s := &service{t: t, name: name, addr: freeAddr(t), dir: t.TempDir(), env: env, out: &syncBuffer{}}
	t.Cleanup(func() {
		s.mu.Lock()
		p := s.p
		s.mu.Unlock()
		if p != nil {
			select {
			case <-p.done:
			default:
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			t.Logf("%s output (tail):\n%s", s.name, tail(s.out.String(), 6000))
		}
	})
	s.start()
	return s
}

func (s *service) url(path string) string { return "http://" + s.addr + path }

// start runs a new incarnation on the service's address and waits until it is ready.
func (s *service) start() {
	t := s.t
	t.Helper()
	env := map[string]string{"BILLING_HTTP_ADDR": s.addr, "BILLING_LOG_LEVEL": "info"}
	maps.Copy(env, s.env)
	p := &proc{addr: s.addr, out: s.out, done: make(chan struct{})}
	p.cmd = exec.Command(binary(t), "serve")
	p.cmd.Dir = s.dir
	p.cmd.Env = baseEnv(env)
	p.cmd.Stdout, p.cmd.Stderr = s.out, s.out
	fmt.Fprintf(s.out, "=== %s: start\n", s.name)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", s.name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()
	p.waitReady(t, 90*time.Second)
}

// kill SIGKILLs the current incarnation and waits until it is gone.
func (s *service) kill() {
	t := s.t
	t.Helper()
	s.mu.Lock()
	p := s.p
	s.peakKB = max(s.peakKB, procStatusKB(p.cmd.Process.Pid, "VmHWM"))
	s.mu.Unlock()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s: %v", s.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s still running 30s after SIGKILL", s.name)
	}
	s.kills++
	fmt.Fprintf(s.out, "=== %s: SIGKILL\n", s.name)
}

// ---------------------------------------------------------------------------------------------
// Senders that deliver like Stripe.

type sendStats struct {
	attempts, acked, received, duplicate, status503, other, connErrors, outage503, undelivered atomic.Int64

	mu         sync.Mutex
	otherCodes map[int]int
	// ackedEvent[i]: plan event i got a 200; receivedBy[i]: how many 200 "received" it got.
	ackedEvent []atomic.Bool
	receivedBy []atomic.Int32
	// storedAt[i]: when plan event i got its "received" (the acknowledgement that stored it), in
	// Unix nanoseconds: the start of the wait that the recovery figure measures.
	storedAt []atomic.Int64
	// firstAck[i]: when plan event i first got any 200, in Unix nanoseconds: by then its row is
	// committed, and so are its effects when it was applied in its receive transaction.
	firstAck []atomic.Int64
}

func (s *sendStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("attempts=%d acked=%d (received=%d duplicate=%d) 503=%d (during outage %d) other=%v conn_errors=%d undelivered=%d",
		s.attempts.Load(), s.acked.Load(), s.received.Load(), s.duplicate.Load(), s.status503.Load(), s.outage503.Load(),
		s.otherCodes, s.connErrors.Load(), s.undelivered.Load())
}

type senders struct {
	targets []string // base URLs; each attempt picks one at random
	client  *http.Client
	stats   *sendStats
	// outage is set by the test while the database is down.
	outage atomic.Bool
	// perDelivery bounds each delivery's retry loop.
	maxAttempts int
	maxDuration time.Duration
}

func newSenders(plan *relPlan, targets []string) *senders {
	return &senders{
		targets: targets,
		client: &http.Client{
			Timeout:   15 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 16, MaxConnsPerHost: 64},
		},
		stats: &sendStats{
			otherCodes: map[int]int{},
			ackedEvent: make([]atomic.Bool, len(plan.Events)),
			receivedBy: make([]atomic.Int32, len(plan.Events)),
			storedAt:   make([]atomic.Int64, len(plan.Events)),
			firstAck:   make([]atomic.Int64, len(plan.Events)),
		},
		maxAttempts: 500,
		maxDuration: 3 * time.Minute,
	}
}

// run delivers every element of deliveries with n concurrent senders; done closes when all are
// delivered or gave up.
func (s *senders) run(ctx context.Context, deliveries []*relEvent, n int) (done <-chan struct{}) {
	ch := make(chan *relEvent)
	finished := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range ch {
				s.deliver(ctx, ev)
			}
		}()
	}
	go func() {
		defer close(ch)
		for _, ev := range deliveries {
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { wg.Wait(); close(finished) }()
	return finished
}

// deliver posts one delivery until it gets a 200, retrying every other answer and every
// connection error with a short capped backoff, at most maxAttempts times.
func (s *senders) deliver(ctx context.Context, ev *relEvent) {
	deadline := time.Now().Add(s.maxDuration)
	for attempt := 1; ; attempt++ {
		code, status, err := s.post(ctx, s.targets[rand.IntN(len(s.targets))], ev)
		s.stats.attempts.Add(1)
		switch {
		case err != nil:
			s.stats.connErrors.Add(1)
		case code == http.StatusOK:
			s.stats.acked.Add(1)
			s.stats.ackedEvent[ev.idx].Store(true)
			s.stats.firstAck[ev.idx].CompareAndSwap(0, time.Now().UnixNano())
			switch status {
			case "received":
				s.stats.received.Add(1)
				s.stats.receivedBy[ev.idx].Add(1)
				s.stats.storedAt[ev.idx].CompareAndSwap(0, time.Now().UnixNano())
			case "duplicate":
				s.stats.duplicate.Add(1)
			}
			return
		case code == http.StatusServiceUnavailable:
			s.stats.status503.Add(1)
			if s.outage.Load() {
				s.stats.outage503.Add(1)
			}
		default:
			s.stats.other.Add(1)
			s.stats.mu.Lock()
			s.stats.otherCodes[code]++
			s.stats.mu.Unlock()
		}
		if attempt >= s.maxAttempts || time.Now().After(deadline) || ctx.Err() != nil {
			s.stats.undelivered.Add(1)
			return
		}
		// Stripe's retry schedule, compressed: a capped exponential backoff with jitter.
		backoff := min(10*time.Millisecond<<min(attempt-1, 5), 250*time.Millisecond)
		select {
		case <-time.After(backoff + time.Duration(rand.IntN(10))*time.Millisecond):
		case <-ctx.Done():
		}
	}
}

func (s *senders) post(ctx context.Context, base string, ev *relEvent) (int, string, error) {
	return postEvent(ctx, s.client, base, ev.Body)
}

// postEvent delivers one signed event and returns the status code and the answered "status".
func postEvent(ctx context.Context, client *http.Client, base string, body []byte) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/webhooks/stripe", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", stripeevents.SignatureHeader(body, relSecret, time.Now()))
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var answer struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(b, &answer)
	return resp.StatusCode, answer.Status, nil
}

// waitUntil polls cond until it holds or limit passes; it reports whether it held.
func waitUntil(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDrained waits until no stored event is still `received` (the workers caught up).
func waitDrained(t *testing.T, db *sql.DB, limit time.Duration) {
	t.Helper()
	t0 := time.Now()
	var received, total int
	var lastErr error
	ok := waitUntil(limit, func() bool {
		lastErr = db.QueryRow(`SELECT count(*) FILTER (WHERE status = 'received'), count(*) FROM webhook_events`).Scan(&received, &total)
		return lastErr == nil && received == 0
	})
	if !ok {
		t.Errorf("after %s, %d of %d stored events are still received (last error: %v)", limit, received, total, lastErr)
		return
	}
	t.Logf("workers drained the inbox %s after the last delivery (%d events stored)", time.Since(t0).Round(time.Millisecond), total)
}

// waitNoticesSent waits until every notice job has done its work (the notice is marked with how
// it went out): jobs of a killed process are rescued, not left behind.
func waitNoticesSent(t *testing.T, db *sql.DB, limit time.Duration) {
	t.Helper()
	t0 := time.Now()
	var pending int
	var lastErr error
	if !waitUntil(limit, func() bool {
		lastErr = db.QueryRow(`SELECT count(*) FROM notices WHERE delivery IS NULL`).Scan(&pending)
		return lastErr == nil && pending == 0
	}) {
		t.Errorf("after %s, %d notices are still unsent (last error: %v)", limit, pending, lastErr)
		return
	}
	t.Logf("every notice sent %s after the inbox drained", time.Since(t0).Round(time.Millisecond))
}

// ---------------------------------------------------------------------------------------------
// The checks.

type relFigures struct {
	Events, Deliveries, Kills int
	Lost                      int // acknowledged events not stored once and processed
	Unacked                   int // events whose every delivery gave up (the senders' bound)
	Failed, DeadLetters       int
	WrongStates               int
	DuplicateNotices          int
	Notices, ExpectedNotices  int
	NoticeMismatches          int
	// AmbiguousNotices are notices that some of the orders the service may have applied the
	// events in call for and others do not.
	AmbiguousNotices int
	StoredRows       int
	// Retried counts events that needed more than one processing attempt (a worker killed
	// mid-transaction, a job timeout, a database error).
	Retried int
}

// verify compares the database and the API with the plan and returns the figures; every
// discrepancy is also reported with t.Errorf.
func verify(t *testing.T, db *sql.DB, plan *relPlan, stats *sendStats, apiBase string) relFigures {
	t.Helper()
	return verifyDropped(t, db, plan, stats, apiBase, nil)
}

// verifyDropped is verify of a run that never delivered the events in dropped (the soak's share
// of lost events, repaired by `billing reconcile` before this runs): those are not expected in
// the log, and a subscription that lost any is held to the status Stripe has (the model's, over
// all its events), not to the ids of the events that set it.
func verifyDropped(t *testing.T, db *sql.DB, plan *relPlan, stats *sendStats, apiBase string, dropped map[string]bool) relFigures {
	t.Helper()
	f := relFigures{Events: len(plan.Events)}
	lostSome := map[string]bool{}
	for _, s := range plan.Subs {
		for _, ev := range s.Events {
			if dropped[ev.ID] {
				lostSome[s.ID] = true
			}
		}
	}
	byID := map[string]*relEvent{}
	for _, ev := range plan.Events {
		byID[ev.ID] = ev
	}
	report := func(count *int, format string, args ...any) {
		*count++
		if *count <= 10 {
			t.Errorf(format, args...)
		}
	}

	// Every event stored once and processed.
	type row struct {
		status      string
		processedAt sql.NullTime
		receivedAt  time.Time
		attempts    int
	}
	rows := map[string]row{}
	q, err := db.Query(`SELECT event_id, status, processed_at, received_at, attempts FROM webhook_events`)
	if err != nil {
		t.Fatalf("read webhook_events: %v", err)
	}
	for q.Next() {
		var id string
		var r row
		if err := q.Scan(&id, &r.status, &r.processedAt, &r.receivedAt, &r.attempts); err != nil {
			t.Fatal(err)
		}
		rows[id] = r
		f.StoredRows++
		if r.attempts > 1 {
			f.Retried++
		}
		if byID[id] == nil {
			t.Errorf("stored event %s is not one the test sent", id)
		}
	}
	q.Close()
	var extra int
	for _, ev := range plan.Events {
		r, stored := rows[ev.ID]
		if dropped[ev.ID] {
			continue
		}
		if !stats.ackedEvent[ev.idx].Load() {
			report(&f.Unacked, "event %s never got a 200 (its deliveries gave up)", ev.ID)
			continue
		}
		if n := stats.receivedBy[ev.idx].Load(); n > 1 {
			report(&extra, "event %s answered %q %d times", ev.ID, "received", n)
		}
		switch {
		case !stored:
			report(&f.Lost, "event %s got a 200 but is not stored", ev.ID)
		case r.status != "processed":
			report(&f.Lost, "event %s got a 200 but is %s after the workers drained (attempts %d)", ev.ID, r.status, r.attempts)
			if r.status == "failed" {
				f.Failed++
			}
		}
	}
	if f.StoredRows != len(plan.Events)-len(dropped) {
		t.Errorf("webhook_events holds %d rows, want one per distinct event delivered: %d", f.StoredRows, len(plan.Events)-len(dropped))
	}
	if err := db.QueryRow(`SELECT count(*) FROM webhook_dead_letters`).Scan(&f.DeadLetters); err != nil {
		t.Fatal(err)
	}
	if f.DeadLetters != 0 {
		t.Errorf("%d dead letters, want none", f.DeadLetters)
	}

	// Each subscription's state is what its newest events say.
	type subRow struct {
		customer, status   string
		subEventID         sql.NullString
		paymentHold        bool
		holdKind           sql.NullString
		invEventID, invoic sql.NullString
		trialWillEnd       sql.NullTime
		pauseBehavior      sql.NullString
	}
	subs := map[string]subRow{}
	q, err = db.Query(`SELECT subscription_id, stripe_customer_id, status, sub_event_id, payment_hold, payment_hold_kind,
		inv_event_id, latest_invoice_id, trial_will_end_at, pause_collection_behavior FROM subscriptions`)
	if err != nil {
		t.Fatalf("read subscriptions: %v", err)
	}
	for q.Next() {
		var id string
		var r subRow
		if err := q.Scan(&id, &r.customer, &r.status, &r.subEventID, &r.paymentHold, &r.holdKind, &r.invEventID, &r.invoic,
			&r.trialWillEnd, &r.pauseBehavior); err != nil {
			t.Fatal(err)
		}
		subs[id] = r
	}
	q.Close()
	if len(subs) != len(plan.Subs) {
		t.Errorf("subscriptions holds %d rows, want %d", len(subs), len(plan.Subs))
	}
	for _, s := range plan.Subs {
		want := s.expected()
		got, ok := subs[s.ID]
		if !ok {
			report(&f.WrongStates, "subscription %s: no row", s.ID)
			continue
		}
		var diffs []string
		if got.customer != s.Customer {
			diffs = append(diffs, fmt.Sprintf("customer %s, want %s", got.customer, s.Customer))
		}
		if lostSome[s.ID] {
			if got.status != want.Status {
				report(&f.WrongStates, "subscription %s (events dropped, repaired by reconcile): status %s (from %s), want %s",
					s.ID, got.status, got.subEventID.String, want.Status)
			}
			continue
		}
		if got.status != want.Status || got.subEventID.String != want.SubEventID {
			diffs = append(diffs, fmt.Sprintf("status %s (from %s), want %s (from %s)", got.status, got.subEventID.String, want.Status, want.SubEventID))
		}
		if got.paymentHold != want.PaymentHold || got.invEventID.String != want.InvEventID || got.invoic.String != want.InvoiceID {
			diffs = append(diffs, fmt.Sprintf("payment_hold %v (from %s, invoice %s), want %v (from %s, invoice %s)",
				got.paymentHold, got.invEventID.String, got.invoic.String, want.PaymentHold, want.InvEventID, want.InvoiceID))
		}
		// The kind only means something while the hold is there.
		if want.PaymentHold && got.holdKind.String != want.HoldKind {
			diffs = append(diffs, fmt.Sprintf("payment_hold_kind %q, want %q", got.holdKind.String, want.HoldKind))
		}
		if got.pauseBehavior.Valid != want.PauseCollection {
			diffs = append(diffs, fmt.Sprintf("pause_collection_behavior %v, want set %v", got.pauseBehavior, want.PauseCollection))
		}
		// The event's created is whole seconds on the wire; the plan's times may have fractions.
		if (want.TrialWillEnd == nil) != !got.trialWillEnd.Valid ||
			(want.TrialWillEnd != nil && !got.trialWillEnd.Time.Equal(want.TrialWillEnd.Truncate(time.Second))) {
			diffs = append(diffs, fmt.Sprintf("trial_will_end_at %v, want %v", got.trialWillEnd, want.TrialWillEnd))
		}
		if len(diffs) > 0 {
			report(&f.WrongStates, "subscription %s: %s", s.ID, strings.Join(diffs, "; "))
		}
	}

	// The links keep their customer's newest customer.updated; an update of a customer no user is
	// linked to makes no link.
	type cusRow struct {
		user, email, name string
		eventID           sql.NullString
	}
	links := map[string]cusRow{}
	q, err = db.Query(`SELECT stripe_customer_id, user_id, email, name, cus_event_id FROM customers`)
	if err != nil {
		t.Fatalf("read customers: %v", err)
	}
	for q.Next() {
		var id string
		var r cusRow
		if err := q.Scan(&id, &r.user, &r.email, &r.name, &r.eventID); err != nil {
			t.Fatal(err)
		}
		links[id] = r
	}
	q.Close()
	linked := 0
	for _, s := range plan.Subs {
		got, ok := links[s.Customer]
		if s.User == "" {
			if ok {
				report(&f.WrongStates, "customer %s: linked to %s, but the test linked no user", s.Customer, got.user)
			}
			continue
		}
		linked++
		email, name, eventID := s.expectedCustomer()
		if !ok || got.user != s.User || got.email != email || got.name != name || got.eventID.String != eventID {
			report(&f.WrongStates, "customer %s: %+v (present %v); want user %s, email %s, name %q from %q",
				s.Customer, got, ok, s.User, email, name, eventID)
		}
	}
	planLinks := 0 // links of the plan's customers (the soak's app traffic makes others)
	for _, s := range plan.Subs {
		if _, ok := links[s.Customer]; ok {
			planLinks++
		}
	}
	if planLinks != linked {
		t.Errorf("customers holds %d links of the plan's customers, want the %d links the test made", planLinks, linked)
	}

	// The entitlement API of the linked users says the same.
	for _, s := range plan.Subs {
		if s.User == "" {
			continue
		}
		want := s.expected()
		code, body := get(t, apiBase+"/v1/customers/"+s.User, relAPIToken)
		var view struct {
			Subscriptions []struct {
				SubscriptionID   string `json:"subscription_id"`
				Status           string `json:"status"`
				CollectionPaused bool   `json:"collection_paused"`
			} `json:"subscriptions"`
		}
		// The plan's pauses resume a month after they begin: every one is still in force.
		if code != http.StatusOK || json.Unmarshal([]byte(body), &view) != nil || len(view.Subscriptions) != 1 ||
			view.Subscriptions[0].SubscriptionID != s.ID || view.Subscriptions[0].Status != want.Status ||
			view.Subscriptions[0].CollectionPaused != want.PauseCollection {
			report(&f.WrongStates, "customer view of %s: %d %s; want %s %s collection_paused %v",
				s.User, code, body, s.ID, want.Status, want.PauseCollection)
		}
		code, body = get(t, apiBase+"/v1/customers/"+s.User+"/entitlement", relAPIToken)
		got, err := entitlementOf([]byte(body))
		if code != http.StatusOK || err != nil {
			report(&f.WrongStates, "entitlement of %s: %d %s", s.User, code, body)
			continue
		}
		if lostSome[s.ID] && (got.Status != want.Status || got.Entitled != want.Entitled) {
			report(&f.WrongStates, "entitlement of %s (events dropped, repaired by reconcile): %s; want status %s entitled %v",
				s.User, body, want.Status, want.Entitled)
			continue
		}
		if lostSome[s.ID] {
			continue
		}
		if got.Status != want.Status || got.OnHold != want.OnHold || got.HoldReason != want.HoldReason ||
			got.Entitled != want.Entitled || got.SubscriptionID != s.ID {
			report(&f.WrongStates, "entitlement of %s: %s; want status %s entitled %v on_hold %v hold_reason %q",
				s.User, body, want.Status, want.Entitled, want.OnHold, want.HoldReason)
		}
	}

	// Exactly the notices the rules call for, each once (row and River job). The rules depend on
	// what the subscription looked like when the event was applied, so they are replayed in the
	// order the service applied each subscription's events: processed_at, which both the receive
	// transaction and a worker take after the handler ran, under the subscription's row lock. An
	// event whose processed_at is not after its receipt (the clock did not move between them) is
	// placed between its receipt and its first 200 instead. An event whose span overlaps another
	// event's of its subscription may have been applied before or after it: each such order is
	// replayed, and a notice that some orders call for and others do not may be there or not
	// (counted as ambiguous; it must still be there at most once).
	type span struct{ lo, hi time.Time }
	spanOf := func(ev *relEvent) span {
		r := rows[ev.ID]
		if r.processedAt.Time.After(r.receivedAt) {
			return span{r.processedAt.Time, r.processedAt.Time}
		}
		// A millisecond of slack: the database rounds to microseconds, and the test's clock reads
		// the acknowledgements.
		hi := time.Unix(1<<40, 0)
		if ns := stats.firstAck[ev.idx].Load(); ns != 0 {
			hi = time.Unix(0, ns).Add(time.Millisecond)
		}
		return span{r.receivedAt.Add(-time.Millisecond), hi}
	}
	expected := map[[2]string]bool{}  // every order calls for it
	ambiguous := map[[2]string]bool{} // some orders do
	for _, s := range plan.Subs {
		evs := slices.Clone(s.Events)
		evs = slices.DeleteFunc(evs, func(ev *relEvent) bool { return !rows[ev.ID].processedAt.Valid })
		spans := map[*relEvent]span{}
		for _, ev := range evs {
			spans[ev] = spanOf(ev)
		}
		sort.SliceStable(evs, func(i, j int) bool { return spans[evs[i]].lo.Before(spans[evs[j]].lo) })
		for _, ev := range evs {
			e := spans[ev]
			var before, either []*relEvent
			for _, o := range evs {
				switch x := spans[o]; {
				case o == ev || x.lo.After(e.hi):
				case x.hi.Before(e.lo):
					before = append(before, o)
				default:
					either = append(either, o)
				}
			}
			if len(either) > 10 {
				// Too many to replay (it does not happen at these sizes): whatever it calls for
				// may be there.
				if k := noticeKindOf(ev); k != "" {
					ambiguous[[2]string{ev.ID, k}] = true
				}
				continue
			}
			calls, all := 0, 1<<len(either)
			kind := ""
			for mask := range all {
				prior := slices.Clone(before)
				for b, o := range either {
					if mask&(1<<b) != 0 {
						prior = append(prior, o)
					}
				}
				sort.SliceStable(prior, func(i, j int) bool { return spans[prior[i]].lo.Before(spans[prior[j]].lo) })
				var m noticeModel
				for _, o := range prior {
					m.apply(o)
				}
				if k := m.apply(ev); k != "" {
					calls, kind = calls+1, k
				}
			}
			switch {
			case calls == all:
				expected[[2]string{ev.ID, kind}] = true
			case calls > 0:
				ambiguous[[2]string{ev.ID, kind}] = true
			}
		}
	}
	f.AmbiguousNotices = len(ambiguous)
	f.ExpectedNotices = len(expected)
	byType := map[string]int{}
	for _, ev := range plan.Events {
		byType[ev.Type]++
	}
	byKind := map[string]int{}
	for k := range expected {
		byKind[k[1]]++
	}
	t.Logf("plan: %d subscriptions, events by type %v; notices the rules call for: %v", len(plan.Subs), byType, byKind)
	countBy := func(query string) map[[2]string]int {
		out := map[[2]string]int{}
		q, err := db.Query(query)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		defer q.Close()
		for q.Next() {
			var k [2]string
			var n int
			if err := q.Scan(&k[0], &k[1], &n); err != nil {
				t.Fatal(err)
			}
			out[k] = n
		}
		return out
	}
	noticeRows := countBy(`SELECT event_id, kind, count(*) FROM notices GROUP BY 1, 2`)
	// Each notice row is queued to be sent (or already handled), with what its mail says.
	noticeQueued := countBy(`SELECT event_id, kind, count(*) FROM notices
		WHERE content IS NOT NULL AND (next_attempt_at IS NOT NULL OR delivery IS NOT NULL) GROUP BY 1, 2`)
	for k, n := range noticeRows {
		f.Notices += n
		if n > 1 {
			report(&f.DuplicateNotices, "event %s has %d %s notices", k[0], n, k[1])
		}
		if !expected[k] && !ambiguous[k] {
			report(&f.NoticeMismatches, "event %s has a %s notice the rules do not call for", k[0], k[1])
		}
		if noticeQueued[k] == 0 {
			report(&f.NoticeMismatches, "the %s notice of %s is not queued to be sent", k[1], k[0])
		}
	}
	for k := range expected {
		if noticeRows[k] == 0 {
			report(&f.NoticeMismatches, "event %s should have sent a %s notice and did not", k[0], k[1])
		}
	}
	return f
}

// logFigures prints the figures of one run: with t.Logf, and as one line on stdout.
func logFigures(t *testing.T, name string, f relFigures, stats *sendStats, elapsed time.Duration) {
	t.Helper()
	line := fmt.Sprintf("%s: events=%d deliveries=%d kills=%d lost=%d wrong_states=%d duplicate_notices=%d "+
		"(notices=%d expected=%d ambiguous=%d mismatches=%d unacked=%d failed=%d dead_letters=%d retried_events=%d elapsed=%s)",
		name, f.Events, f.Deliveries, f.Kills, f.Lost, f.WrongStates, f.DuplicateNotices,
		f.Notices, f.ExpectedNotices, f.AmbiguousNotices, f.NoticeMismatches, f.Unacked, f.Failed, f.DeadLetters, f.Retried, elapsed.Round(time.Millisecond))
	t.Log(line)
	t.Logf("%s: senders: %s", name, stats)
	fmt.Println(line)
}

// runVerifyCommand runs `billing verify` on the storm's database and fails the test on any
// difference between the live tables and the stored log's replay: the check that does not share
// the model's idea of what the handlers should do. It returns the summary line.
func runVerifyCommand(t *testing.T, env map[string]string) string {
	t.Helper()
	cmd := exec.Command(binary(t), "verify")
	cmd.Env = baseEnv(map[string]string{"BILLING_DATABASE_URL": env["BILLING_DATABASE_URL"], "BILLING_LOG_LEVEL": "warn"})
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	summary := lines[len(lines)-1]
	if err != nil || !strings.HasPrefix(summary, "verify: ") || !strings.Contains(summary, " differences=0 ") {
		t.Errorf("billing verify after the storm: %v\nstdout (head):\n%s\nstderr:\n%s", err, head(out.String(), 4000), tail(errOut.String(), 2000))
	}
	return summary
}

func head(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + " …"
}

// dedicatedCluster starts a PostgreSQL cluster of the test's own, which the test may stop and
// restart (-m immediate) without disturbing any other test, and returns it with its URL and a
// handle that keeps no connection across an outage. It skips the test where no server binaries
// are installed.
func dedicatedCluster(t *testing.T) (*pgcluster.Cluster, string, *sql.DB) {
	t.Helper()
	dir, err := os.MkdirTemp("", "billing-outage-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // the postgres user must reach it when we are root
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{Dir: dir, NoSync: true, RemoveOnExit: true})
	if errors.Is(err, pgcluster.ErrNoServer) {
		t.Skipf("no PostgreSQL server binaries for a dedicated cluster: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
		defer scancel()
		_ = cluster.Stop(sctx)
	})
	url := cluster.URL("postgres")
	db := openDB(t, url)
	// The pool must not keep connections across the outage: the checks run after it.
	db.SetMaxIdleConns(0)
	// NoSync also turns synchronous_commit off, and then an immediate stop drops the last commits
	// still in the WAL buffers: a 200 for them would be a promise the test itself broke. fsync
	// may stay off (the machine does not crash, only PostgreSQL), synchronous_commit must not.
	if _, err := db.Exec(`ALTER SYSTEM SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	return cluster, url, db
}
