// Package admin is the operator console under /admin: the HTML page (payment holds and
// dead-lettered events) and GET /admin/holds. It owns no state: it reads the domain packages
// through the small interfaces it declares below, and imports them only for their types.
//
// The console will grow (the event log, a subscription's view, reconcile runs). Each page or
// route is a handler here, registered in Mount, reading through an interface declared here,
// with its template in templates/admin/. The composition root mounts the console on the /admin
// group after admin authentication; the JSON event log and replay are still the webhooks
// inbox's own routes on that group.
package admin

import (
	"context"
	"fmt"
	htmltemplate "html/template"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"

	"billing/billing"
	"billing/templates"
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

// Deps are what the console reads from.
type Deps struct {
	Holds HoldSource
	// DeadLetters feeds the page's dead-letter section, which says "not available" when nil.
	DeadLetters DeadLetterSource
	Logger      *slog.Logger
	// Now stamps the page; time.Now when nil.
	Now func() time.Time
}

// Console serves the admin routes.
type Console struct {
	holds       HoldSource
	deadLetters DeadLetterSource
	log         *slog.Logger
	now         func() time.Time
	page        *htmltemplate.Template
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
	page, err := htmltemplate.New("").ParseFS(templates.FS, "admin/admin.html")
	if err != nil {
		panic(fmt.Errorf("admin: parse admin template: %w", err))
	}
	return &Console{
		holds:       d.Holds,
		deadLetters: d.DeadLetters,
		log:         d.Logger.With("component", "admin"),
		now:         d.Now,
		page:        page,
	}
}

// Mount adds, on the /admin group (admin auth applied by the caller):
//
//	GET /holds  → {"holds": [billing.HoldView]}
//	GET ""      → the HTML page (holds and dead letters) at /admin
//	GET "/"     → the same page at /admin/
func (c *Console) Mount(admin *echo.Group) {
	admin.GET("/holds", c.getHolds)
	admin.GET("", c.getPage)
	admin.GET("/", c.getPage)
}
