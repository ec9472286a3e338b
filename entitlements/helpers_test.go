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
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"gorm.io/gorm"

	"billing/billing"
	"billing/billing/billingtest"
	"billing/internal/httpserver"
	"billing/internal/testenv"
	"billing/migrations"
	"billing/webhooks"
)

func TestMain(m *testing.M) { testenv.MainWith(m, migrations.ApplyQuietly) }

// The timeline and the settable clock are the harness's.
const base = testenv.Base

var at = testenv.At

type clock = testenv.Clock

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
	e := &env{db: db, clock: testenv.NewClock(at(0))}
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
	return billingtest.Handle(t, e.db, e.reg, ev)
}

// mustHandle applies events in order and fails the test on any error.
func (e *env) mustHandle(t *testing.T, evs ...webhooks.Event) {
	t.Helper()
	billingtest.MustHandle(t, e.db, e.reg, evs...)
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

func (e *env) countSubs(t *testing.T) int { t.Helper(); return billingtest.CountSubscriptions(t, e.db) }

func (e *env) link(t *testing.T, userID, customerID, email string) {
	t.Helper()
	billingtest.Link(t, e.db, userID, customerID, email)
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
	return billingtest.NoticeCounts(t, e.db, where, args...)
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

// The events' builders are billingtest's.
type (
	subObj = billingtest.Sub
	invObj = billingtest.Invoice
)

var (
	event     = billingtest.Event
	subEv     = billingtest.SubEvent
	invEv     = billingtest.InvoiceEvent
	created   = billingtest.Created
	updated   = billingtest.Updated
	deleted   = billingtest.Deleted
	failed    = billingtest.Failed
	succeeded = billingtest.Succeeded
)

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
