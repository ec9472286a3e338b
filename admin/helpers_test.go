package admin

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"golang.org/x/net/html"
	"gorm.io/gorm"

	"billing/billing"
	"billing/entitlements"
	"billing/internal/apitest"
	"billing/internal/httpserver"
	"billing/internal/testenv"
	"billing/migrations"
	"billing/webhooks"
)

func TestMain(m *testing.M) { testenv.MainWith(m, migrations.ApplyQuietly) }

// at is an instant of the tests' fixed timeline (testenv.Base plus sec seconds), that event
// times count from.
var at = testenv.At

// env is the console on a real billing service (its own migrated database, events applied by
// billing's own handlers) and a dead-letter source the test fills.
type env struct {
	db   *gorm.DB
	svc  *billing.Service
	ents *entitlements.Service
	reg  *webhooks.Registry
	dead *fakeDeadLetters
	echo *echo.Echo
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := testenv.DB(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	// Insert-only: a payment failure queues a notice in its transaction.
	rc, err := river.NewClient(riverdatabasesql.New(sqlDB), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("river client: %v", err)
	}
	now := func() time.Time { return at(0) }
	svc := billing.New(billing.Deps{DB: db, Jobs: rc, Now: now})
	ents := entitlements.New(entitlements.Deps{DB: db, Billing: svc, Jobs: rc, Now: now,
		Policy: entitlements.Policy{PastDueEntitled: true}})
	svc.SetTeller(ents)
	e := &env{db: db, svc: svc, ents: ents, reg: webhooks.NewRegistry(), dead: &fakeDeadLetters{}, echo: echo.New()}
	svc.Register(e.reg)
	ents.Register(e.reg)
	e.echo.HTTPErrorHandler = httpserver.ErrorHandler(slog.New(slog.DiscardHandler))
	New(Deps{Holds: svc, DeadLetters: e.dead, Now: now}).Mount(e.echo.Group("/admin"))
	return e
}

// handle applies Stripe events (as built by internal/stripeevents) with billing's handlers,
// each in its own transaction as the inbox's worker does.
func (e *env) handle(t *testing.T, payloads ...[]byte) {
	t.Helper()
	for _, payload := range payloads {
		var p struct {
			ID         string `json:"id"`
			Type       string `json:"type"`
			Created    int64  `json:"created"`
			Livemode   bool   `json:"livemode"`
			APIVersion string `json:"api_version"`
			Data       struct {
				Object json.RawMessage `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal(payload, &p); err != nil {
			t.Fatal(err)
		}
		h, ok := e.reg.Lookup(p.Type)
		if !ok {
			t.Fatalf("no handler for %s", p.Type)
		}
		ev := webhooks.Event{ID: p.ID, Type: p.Type, Livemode: p.Livemode, APIVersion: p.APIVersion,
			Created: time.Unix(p.Created, 0).UTC(), Payload: payload, Object: p.Data.Object}
		if err := e.db.Transaction(func(tx *gorm.DB) error { return h.HandleEvent(context.Background(), tx, ev) }); err != nil {
			t.Fatalf("handle %s %s: %v", p.Type, p.ID, err)
		}
	}
}

func (e *env) link(t *testing.T, userID, customerID, email string) {
	t.Helper()
	testenv.LinkCustomer(t, e.db, userID, customerID, email, false)
}

func (e *env) get(t *testing.T, path string) *httptest.ResponseRecorder {
	t.Helper()
	// No token: the console's auth is not mounted here.
	return apitest.Do(t, e.echo, "", http.MethodGet, path, nil)
}

func (e *env) page(t *testing.T, path string) (*html.Node, http.Header) {
	t.Helper()
	rec := e.get(t, path)
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Header().Get("Content-Type"))
	}
	doc, err := html.Parse(rec.Body)
	if err != nil {
		t.Fatalf("parse admin page: %v", err)
	}
	return doc, rec.Header()
}

type fakeDeadLetters struct {
	mu    sync.Mutex
	items []webhooks.DeadLetter
	err   error
}

func (f *fakeDeadLetters) set(items []webhooks.DeadLetter, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.items, f.err = items, err
}

func (f *fakeDeadLetters) DeadLetters(_ context.Context, limit int) ([]webhooks.DeadLetter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if len(f.items) > limit {
		return f.items[:limit], nil
	}
	return f.items, nil
}

// cells returns, for every <tr> with the given data attribute inside the table with id tableID,
// the attribute's value mapped to the row's cells by class name (text content, and the href or
// form action for links and forms).
func cells(t *testing.T, doc *html.Node, tableID, rowAttr string) map[string]map[string]string {
	t.Helper()
	var table *html.Node
	walk(doc, func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "table" && attr(n, "id") == tableID {
			table = n
		}
	})
	if table == nil {
		return nil
	}
	rows := map[string]map[string]string{}
	walk(table, func(n *html.Node) {
		if n.Type != html.ElementNode || n.Data != "tr" || attr(n, rowAttr) == "" {
			return
		}
		row := map[string]string{}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			if c.Type != html.ElementNode || c.Data != "td" {
				continue
			}
			class := attr(c, "class")
			if i := strings.IndexByte(class, ' '); i >= 0 {
				class = class[:i]
			}
			row[class] = strings.TrimSpace(text(c))
			walk(c, func(m *html.Node) {
				if m.Type == html.ElementNode && m.Data == "a" {
					row[class+".href"] = attr(m, "href")
				}
				if m.Type == html.ElementNode && m.Data == "form" {
					row[class+".action"] = attr(m, "action")
					row[class+".method"] = attr(m, "method")
				}
			})
		}
		rows[attr(n, rowAttr)] = row
	})
	return rows
}

// ids are the element ids on a page.
func ids(doc *html.Node) map[string]bool {
	found := map[string]bool{}
	walk(doc, func(n *html.Node) {
		if id := attr(n, "id"); id != "" {
			found[id] = true
		}
	})
	return found
}

func walk(n *html.Node, f func(*html.Node)) {
	f(n)
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		walk(c, f)
	}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func text(n *html.Node) string {
	var b strings.Builder
	walk(n, func(m *html.Node) {
		if m.Type == html.TextNode {
			b.WriteString(m.Data)
		}
	})
	return strings.Join(strings.Fields(b.String()), " ")
}
