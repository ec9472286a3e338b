// Package admin is the operator console under /admin: server-rendered pages that work without
// JavaScript (overview, holds, event log, event detail, subscription, customer, charges,
// catalog, reconciliation, audit log, dead letters), GET /admin/holds and GET /admin/audit. It owns no state: it reads the domain packages through the small interfaces it
// declares below, and imports them only for their types.
//
// Each page is a handler here, registered in Mount, with its template in templates/admin/ (one
// layout with the navigation, one file per page). The composition root mounts the console on the
// /admin group after admin authentication, which also checks the CSRF token of every form post
// made with Basic credentials (internal/auth); the JSON event log and replay are still the webhooks
// inbox's own routes on that group.
package admin

import (
	"context"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"

	"billing/appevents"
	"billing/billing"
	"billing/catalog"
	"billing/customers"
	"billing/entitlements"
	"billing/internal/audit"
	"billing/ledger"
	"billing/reconcile"
	"billing/usage"
	"billing/webhooks"
)

// HoldSource lists the subscriptions on hold now: billing.Service.
type HoldSource interface {
	Holds(ctx context.Context) ([]billing.HoldView, error)
}

// DeadLetterSource lists dead-lettered events, newest first: webhooks.Inbox.
type DeadLetterSource interface {
	DeadLetters(ctx context.Context, limit int) ([]webhooks.DeadLetter, error)
}

// EventLog is the inbox as the event pages read it, and its replay: webhooks.Inbox.
type EventLog interface {
	SearchEvents(ctx context.Context, q webhooks.EventQuery) (*webhooks.EventPage, error)
	EventDetail(ctx context.Context, eventID string) (*webhooks.EventDetail, error)
	EventsNaming(ctx context.Context, objectID string, limit int) ([]webhooks.LoggedEvent, error)
	Stats(ctx context.Context, since time.Time) (*webhooks.InboxStats, error)
	DeadLetterList(ctx context.Context, q webhooks.DeadLetterQuery) ([]webhooks.DeadLetter, error)
	DeadLetterTypes(ctx context.Context) ([]webhooks.DeadLetterType, error)
	CountDeadLetters(ctx context.Context, q webhooks.DeadLetterQuery) (int64, error)
	Replay(ctx context.Context, eventID string) (string, error)
	ReplayDeadLetters(ctx context.Context, q webhooks.DeadLetterQuery, limit int) (int, int64, error)
	HandledTypes() []string
}

// SubscriptionSource is billing as the subscription page reads it: billing.Service.
type SubscriptionSource interface {
	FindSubscriptions(ctx context.Context, id string, limit int) ([]billing.SubscriptionRef, error)
	SubscriptionNotices(ctx context.Context, subscriptionID string, livemode bool, limit int) ([]billing.NoticeRow, error)
	SubscriptionInvoices(ctx context.Context, subscriptionID string, livemode bool, limit int) ([]billing.InvoiceRow, error)
}

// ChargeSource is the ledger as the console reads it: ledger.Service.
type ChargeSource interface {
	CustomerCharges(ctx context.Context, stripeCustomerID string, livemode bool, limit int) ([]ledger.ChargeRow, error)
	SearchCharges(ctx context.Context, q ledger.ChargeQuery) (*ledger.ChargePage, error)
	UserCharges(ctx context.Context, userID string, livemode bool, before *ledger.ChargeCursor, limit int) ([]ledger.ChargeRow, error)
	Charge(ctx context.Context, orderID string, livemode bool) (*ledger.ChargeRow, error)
	ChargeRefunds(ctx context.Context, orderID string, livemode bool) ([]ledger.RefundRow, error)
	RefundsOf(ctx context.Context, orderIDs []string, livemode bool) ([]ledger.RefundRow, error)
	FindCharges(ctx context.Context, id string, livemode bool, limit int) ([]ledger.ChargeRow, error)
}

// PeopleSource finds the app's users by id, email or name: customers.Directory.
type PeopleSource interface {
	Person(ctx context.Context, userID string, livemode bool) (*customers.Person, error)
	Find(ctx context.Context, text string, livemode bool, limit int) ([]customers.Person, error)
}

// PolicySource is the entitlement policy's answers on the subscription and customer pages:
// entitlements.Service.
type PolicySource interface {
	SubscriptionState(ctx context.Context, subscriptionID string) (*entitlements.SubscriptionState, error)
	CustomerAccount(ctx context.Context, userID, stripeCustomerID string, livemode bool) (*entitlements.Account, error)
}

// AccountSource is billing as the customer page reads it: billing.Service.
type AccountSource interface {
	CustomerInvoices(ctx context.Context, stripeCustomerID string, livemode bool, before *billing.PageCursor, limit int) ([]billing.InvoiceRow, error)
	CustomerNotices(ctx context.Context, stripeCustomerID string, livemode bool, before *billing.PageCursor, limit int) ([]billing.NoticeRow, error)
}

// UsageSource is metered usage as the customer page reads it: usage.Service.
type UsageSource interface {
	MeterTotals(ctx context.Context, userID string, livemode bool, period *usage.Period) ([]usage.MeterTotal, error)
}

// AppEventSource is the app events of the deployment's mode and their push: appevents.Service.
type AppEventSource interface {
	List(ctx context.Context, q appevents.AdminQuery) ([]appevents.AdminEvent, error)
}

// RunSource is reconciliation as its page reads and starts it: reconcile.Service.
type RunSource interface {
	RunPage(ctx context.Context, before string, limit int) ([]reconcile.RunView, bool, error)
	RunByID(ctx context.Context, runID string) (*reconcile.RunView, error)
	DriftFields(ctx context.Context, runID string) ([]reconcile.FieldCount, error)
	DriftPage(ctx context.Context, runID, field string, after int64, limit int) ([]reconcile.DriftView, bool, error)
	Start(opts reconcile.RunOptions) (string, error)
}

// AuditSource reads the audit log: audit.Log.
type AuditSource interface {
	List(ctx context.Context, q audit.Query) (*audit.Page, error)
}

// CatalogSource is the catalog as the console reads it: catalog.Service. PriceNames names the
// prices that the subscription and customer pages show.
type CatalogSource interface {
	Products(ctx context.Context, livemode bool) ([]catalog.ProductView, error)
	AllPrices(ctx context.Context, livemode bool) ([]catalog.PriceView, error)
	PriceNames(ctx context.Context, livemode bool, priceIDs []string) (map[string]string, error)
}

// ReconcileSource reads the last reconciliation run for the overview: reconcile.Service.
type ReconcileSource interface {
	LastRun(ctx context.Context, livemode bool, drift int) (*reconcile.LastRunView, error)
}

// Deps are what the console reads from. Only Holds is required; a page whose source is nil says
// that it is not available.
type Deps struct {
	Holds HoldSource
	// DeadLetters feeds the overview's dead-letter section.
	DeadLetters   DeadLetterSource
	Events        EventLog
	Subscriptions SubscriptionSource
	// Policy is read with Subscriptions and Accounts: a page needs both.
	Policy    PolicySource
	Charges   ChargeSource
	Reconcile ReconcileSource
	People    PeopleSource
	Accounts  AccountSource
	Runs      RunSource
	Audit     AuditSource
	Usage     UsageSource
	AppEvents AppEventSource
	// Catalog feeds the catalog page and the price names; without it prices show as their ids.
	Catalog CatalogSource
	// Livemode is stripe.mode: the mode the console says it runs in.
	Livemode bool
	Logger   *slog.Logger
	// Now stamps the pages and measures ages; time.Now when nil.
	Now func() time.Time
}

// Console serves the admin routes.
type Console struct {
	d     Deps
	log   *slog.Logger
	now   func() time.Time
	pages map[string]*pageTemplate
}

// New builds the console. It panics on a wiring bug (no hold source, a template that does not
// parse: the templates are embedded).
func New(d Deps) *Console {
	if d.Holds == nil {
		panic("admin: Deps.Holds is nil")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	return &Console{d: d, log: d.Logger.With("component", "admin"), now: d.Now, pages: parsePages()}
}

// Paths of the pages, under /admin.
const (
	pathHolds       = "/admin/ui/holds"
	pathEvents      = "/admin/ui/events"
	pathDeadLetters = "/admin/ui/dead-letters"
	pathFind        = "/admin/ui/find"
	pathSubs        = "/admin/ui/subscriptions"
	pathCustomers   = "/admin/ui/customers"
	pathCharges     = "/admin/ui/charges"
	pathCatalog     = "/admin/ui/catalog"
	pathReconcile   = "/admin/ui/reconcile"
	pathAudit       = "/admin/ui/audit"
)

// Mount adds, on the /admin group (admin auth applied by the caller):
//
//	GET  /holds                              → {"holds": [billing.HoldView]}
//	GET  "" and "/"                          → the overview (holds and dead letters among it)
//	GET  /ui/holds                           → holds: filters, search, paging
//	GET  /ui/events, /ui/events/{id}         → the event log and one event
//	POST /ui/events/{id}/replay              → replay a failed event, back to its page
//	GET  /ui/subscriptions/{id}              → one subscription: state, reason, timeline, …
//	GET  /ui/customers/{user_id}             → one user: both modes' links, subscriptions, money, notices
//	GET  /ui/charges, /ui/charges/{order_id} → the charges (filters, search, paging) and one charge
//	GET  /ui/catalog                         → the mode's products, their prices and features
//	GET  /ui/reconcile, /ui/reconcile/{id}   → reconcile runs, one run's drift by field
//	POST /ui/reconcile                       → start a run
//	GET  /ui/audit                           → the audit log
//	GET  /audit                              → {"entries": [audit.Entry], "next_before"}
//	GET  /ui/find?q=                         → where an id, email or name leads
//	GET  /ui/dead-letters                    → dead letters by type
//	POST /ui/dead-letters/replay             → replay one
//	GET  /ui/dead-letters/replay-type?type=  → confirm replaying every dead letter of a type
//	POST /ui/dead-letters/replay-type        → do it
func (c *Console) Mount(admin *echo.Group) {
	admin.GET("/holds", c.getHolds)
	admin.GET("", c.getOverview)
	admin.GET("/", c.getOverview)
	admin.GET("/ui/holds", c.getHoldsPage)
	admin.GET("/ui/events", c.getEvents)
	admin.GET("/ui/events/:id", c.getEvent)
	admin.POST("/ui/events/:id/replay", c.postEventReplay)
	admin.GET("/ui/subscriptions/:id", c.getSubscription)
	admin.GET("/ui/find", c.getFind)
	admin.GET("/ui/customers/:id", c.getCustomer)
	admin.GET("/ui/charges", c.getCharges)
	admin.GET("/ui/charges/:id", c.getCharge)
	admin.GET("/ui/catalog", c.getCatalog)
	admin.GET("/ui/reconcile", c.getRuns)
	admin.GET("/ui/reconcile/:id", c.getRun)
	admin.POST("/ui/reconcile", c.postReconcile)
	admin.GET("/ui/audit", c.getAuditPage)
	admin.GET("/audit", c.getAudit)
	admin.GET("/ui/dead-letters", c.getDeadLetters)
	admin.POST("/ui/dead-letters/replay", c.postDeadLetterReplay)
	admin.GET("/ui/dead-letters/replay-type", c.getReplayType)
	admin.POST("/ui/dead-letters/replay-type", c.postReplayType)
}
