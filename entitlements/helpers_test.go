package entitlements

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"gorm.io/gorm"

	"billing/billing"
	"billing/internal/httpserver"
	"billing/internal/testenv"
	"billing/migrations"
	"billing/webhooks"
)

func TestMain(m *testing.M) {
	testenv.SetMigrator(migrations.ApplyQuietly)
	testenv.Main(m)
}

// base is an arbitrary instant (2024-06-01T00:00:00Z) that event times count from.
const base int64 = 1717200000

func at(sec int64) time.Time { return time.Unix(base+sec, 0).UTC() }

// clock is a settable clock for the service.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

type env struct {
	db    *gorm.DB
	subs  *billing.Service
	svc   *Service
	reg   *webhooks.Registry
	clock *clock
	echo  *echo.Echo
}

// envOpt sets the Deps of the service and of the billing it is built on.
type envOpt func(d *Deps, b *billing.Deps)

func withPastDueEntitled(v bool) envOpt {
	return func(d *Deps, _ *billing.Deps) { d.Policy.PastDueEntitled = v }
}

// newEnv gives a test its own migrated database, a service on it with an insert-only River
// client, and an echo instance with the API routes mounted (no auth: main adds it).
func newEnv(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	db := testenv.DB(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverdatabasesql.New(sqlDB), &river.Config{
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("river client: %v", err)
	}
	e := &env{db: db, clock: &clock{t: at(0)}}
	d := Deps{
		DB:     db,
		Jobs:   rc,
		Logger: slog.New(slog.DiscardHandler),
		Now:    e.clock.Now,
		// The configuration's defaults, but for past_due.
		Policy: Policy{PastDueEntitled: true, PausedCollectionEntitled: true},
	}
	bd := billing.Deps{DB: db, Jobs: rc, Logger: d.Logger, Now: d.Now}
	for _, o := range opts {
		o(&d, &bd)
	}
	// Billing as main builds it: the same grace, the policy's word on renewals, and this
	// service as its teller.
	bd.PeriodGrace, bd.Renewals = d.Policy.PeriodGrace, d.Policy
	e.subs = billing.New(bd)
	d.Billing = e.subs
	e.svc = New(d)
	e.subs.SetTeller(e.svc)
	e.reg = webhooks.NewRegistry()
	e.subs.Register(e.reg)
	e.svc.Register(e.reg)

	e.echo = echo.New()
	e.echo.HTTPErrorHandler = httpserver.ErrorHandler(slog.New(slog.DiscardHandler))
	e.subs.MountAPI(e.echo.Group("/v1"))
	e.svc.MountAPI(e.echo.Group("/v1"))
	return e
}

// handle runs an event's handler in its own transaction, as the webhook worker does.
func (e *env) handle(t *testing.T, ev webhooks.Event) error {
	t.Helper()
	h, ok := e.reg.Lookup(ev.Type)
	if !ok {
		t.Fatalf("no handler registered for %s", ev.Type)
	}
	return e.db.Transaction(func(tx *gorm.DB) error {
		return h.HandleEvent(context.Background(), tx, ev)
	})
}

// mustHandle applies events in order and fails the test on any error.
func (e *env) mustHandle(t *testing.T, evs ...webhooks.Event) {
	t.Helper()
	for _, ev := range evs {
		if err := e.handle(t, ev); err != nil {
			t.Fatalf("handle %s %s: %v", ev.Type, ev.ID, err)
		}
	}
}

func (e *env) sub(t *testing.T, id string) *billing.Subscription {
	t.Helper()
	var rows []billing.Subscription
	if err := e.db.Raw(`SELECT s.*, c.user_id FROM subscriptions s LEFT JOIN customers c USING (stripe_customer_id) WHERE subscription_id = $1`, id).Scan(&rows).Error; err != nil {
		t.Fatalf("load subscription %s: %v", id, err)
	}
	if len(rows) != 1 {
		t.Fatalf("subscription %s: %d rows", id, len(rows))
	}
	return &rows[0]
}

func (e *env) countSubs(t *testing.T) int {
	t.Helper()
	var n int64
	if err := e.db.Raw(`SELECT count(*) FROM subscriptions`).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return int(n)
}

func (e *env) link(t *testing.T, userID, customerID, email string) {
	t.Helper()
	err := e.db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ($1, $2, $3)
		ON CONFLICT (user_id, livemode) DO UPDATE SET stripe_customer_id = EXCLUDED.stripe_customer_id, email = EXCLUDED.email`,
		userID, nullIfEmpty(customerID), email).Error
	if err != nil {
		t.Fatalf("link %s: %v", userID, err)
	}
}

// noticeCount counts the notices rows of an event and kind, and those of them queued to be sent.
func (e *env) noticeCount(t *testing.T, eventID, kind string) (rows, due int) {
	t.Helper()
	return e.countNotices(t, `WHERE event_id = $1 AND kind = $2`, eventID, kind)
}

func (e *env) totalNotices(t *testing.T) (rows, due int) {
	t.Helper()
	return e.countNotices(t, ``)
}

func (e *env) countNotices(t *testing.T, where string, args ...any) (rows, due int) {
	t.Helper()
	var n struct{ Rows, Due int }
	if err := e.db.Raw(`SELECT count(*) AS rows, count(*) FILTER (WHERE delivery IS NULL AND next_attempt_at IS NOT NULL) AS due
		FROM notices `+where, args...).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n.Rows, n.Due
}

// customerView is the view GET /v1/customers/{user_id} answers.
func (e *env) customerView(t *testing.T, userID string) CustomerView {
	t.Helper()
	v, err := e.svc.Customer(context.Background(), userID)
	if err != nil {
		t.Fatalf("customer view of %s: %v", userID, err)
	}
	return *v
}

// get performs a GET against the mounted routes and decodes a JSON answer into out (if non-nil).
func (e *env) get(t *testing.T, path string, out any) (int, []byte) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	rec := httptest.NewRecorder()
	e.echo.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Body)
	if out != nil && rec.Code == http.StatusOK {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("GET %s: decode %s: %v", path, body, err)
		}
	}
	return rec.Code, body
}

// ---- event builders -------------------------------------------------------------------------

// subObj describes a subscription snapshot; zero fields are left out of the JSON (or null).
type subObj struct {
	ID, Customer, Status, Price string
	PeriodStart, PeriodEnd      int64 // offsets from base; 0 = absent
	TrialStart, TrialEnd        int64
	CanceledAt, EndedAt         int64
	CancelAtPeriodEnd           bool
	// Quantity is the item's seats; 0 leaves it out.
	Quantity int64
}

func (s subObj) JSON() json.RawMessage {
	ts := func(off int64) any {
		if off == 0 {
			return nil
		}
		return base + off
	}
	items := map[string]any{"object": "list", "data": []any{}}
	if s.Price != "" {
		item := map[string]any{
			"id": "si_" + s.ID, "object": "subscription_item",
			"price": map[string]any{"id": s.Price, "object": "price"},
			"plan":  map[string]any{"id": s.Price, "object": "plan"},
		}
		if s.Quantity != 0 {
			item["quantity"] = s.Quantity
		}
		items["data"] = []any{item}
	}
	m := map[string]any{
		"id": s.ID, "object": "subscription", "customer": s.Customer, "status": s.Status,
		"cancel_at_period_end": s.CancelAtPeriodEnd, "cancel_at": nil,
		"current_period_start": ts(s.PeriodStart), "current_period_end": ts(s.PeriodEnd),
		"trial_start": ts(s.TrialStart), "trial_end": ts(s.TrialEnd),
		"canceled_at": ts(s.CanceledAt), "ended_at": ts(s.EndedAt),
		"items": items, "livemode": false,
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// invObj describes an invoice; Subscription "" makes a one-off invoice.
type invObj struct {
	ID, Customer, Subscription, Email, Currency, URL string
	AttemptCount, AmountDue                          int64
	NextAttempt                                      int64 // offset from base; 0 = null
	// Left out of the JSON when zero.
	Created, PeriodStart, PeriodEnd    int64 // offsets from base
	BillingReason, Status, Number, PDF string
	AmountPaid                         int64
}

func (i invObj) JSON() json.RawMessage {
	m := map[string]any{
		"id": i.ID, "object": "invoice", "customer": i.Customer,
		"attempt_count": i.AttemptCount, "amount_due": i.AmountDue,
		"currency": i.Currency, "hosted_invoice_url": i.URL, "next_payment_attempt": nil,
		"customer_email": nil, "subscription": nil,
	}
	if i.Subscription != "" {
		m["subscription"] = i.Subscription
	}
	if i.Email != "" {
		m["customer_email"] = i.Email
	}
	if i.NextAttempt != 0 {
		m["next_payment_attempt"] = base + i.NextAttempt
	}
	for k, off := range map[string]int64{"created": i.Created, "period_start": i.PeriodStart, "period_end": i.PeriodEnd} {
		if off != 0 {
			m[k] = base + off
		}
	}
	for k, v := range map[string]string{"billing_reason": i.BillingReason, "status": i.Status, "number": i.Number, "invoice_pdf": i.PDF} {
		if v != "" {
			m[k] = v
		}
	}
	if i.AmountPaid != 0 {
		m["amount_paid"] = i.AmountPaid
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// event wraps an object into a webhooks.Event created at base+created seconds.
func event(id, typ string, created int64, obj json.RawMessage) webhooks.Event {
	payload, _ := json.Marshal(map[string]any{
		"id": id, "object": "event", "type": typ, "api_version": webhooks.PinnedAPIVersion,
		"created": base + created, "livemode": false, "data": map[string]any{"object": obj},
	})
	return webhooks.Event{
		ID: id, Type: typ, Livemode: false, APIVersion: webhooks.PinnedAPIVersion,
		Created: at(created), Payload: payload, Object: obj,
	}
}

func subEv(id, typ string, created int64, s subObj) webhooks.Event {
	return event(id, typ, created, s.JSON())
}

func invEv(id, typ string, created int64, i invObj) webhooks.Event {
	return event(id, typ, created, i.JSON())
}

// Shorthands for the common cases.
func created(id string, t int64, s subObj) webhooks.Event {
	return subEv(id, billing.EventSubscriptionCreated, t, s)
}

func updated(id string, t int64, s subObj) webhooks.Event {
	return subEv(id, billing.EventSubscriptionUpdated, t, s)
}

func deleted(id string, t int64, s subObj) webhooks.Event {
	return subEv(id, billing.EventSubscriptionDeleted, t, s)
}

func failed(id string, t int64, i invObj) webhooks.Event {
	return invEv(id, billing.EventInvoicePaymentFailed, t, i)
}

func succeeded(id string, t int64, i invObj) webhooks.Event {
	return invEv(id, billing.EventInvoicePaymentSucceeded, t, i)
}

func (s subObj) with(status string) subObj { s.Status = status; return s }

// summaryEv is an entitlements.active_entitlement_summary.updated of a customer listing
// lookupKeys, with has_more as given.
func summaryEv(id string, created int64, customer string, more bool, lookupKeys ...string) webhooks.Event {
	data := []any{}
	for i, k := range lookupKeys {
		data = append(data, map[string]any{"id": fmt.Sprintf("ent_%s_%d", id, i), "object": "entitlements.active_entitlement",
			"feature": "feat_" + k, "livemode": false, "lookup_key": k})
	}
	obj, _ := json.Marshal(map[string]any{
		"object": "entitlements.active_entitlement_summary", "customer": customer, "livemode": false,
		"entitlements": map[string]any{"object": "list", "data": data, "has_more": more, "url": "/v1/customer/" + customer + "/entitlements"},
	})
	return event(id, EventEntitlementSummaryUpdated, created, obj)
}

func ptrStr(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func ptrTime(p *time.Time) string {
	if p == nil {
		return "<nil>"
	}
	return p.UTC().Format(time.RFC3339)
}

func ptrInt(p *int64) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprint(*p)
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
