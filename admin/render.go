package admin

import (
	"bytes"
	"fmt"
	htmltemplate "html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/auth"
	"billing/internal/display"
	"billing/templates"
)

// pageTemplate is the layout with one page's "content".
type pageTemplate = htmltemplate.Template

// pageNames are the page files under templates/admin/, each defining "content" (and "title").
var pageNames = []string{"overview", "holds", "events", "event", "subscription", "find", "deadletters", "confirm", "message",
	"customer", "charges", "charge", "runs", "run", "audit", "catalog"}

func parsePages() map[string]*pageTemplate {
	base, err := htmltemplate.New("").Funcs(funcs).ParseFS(templates.FS, "admin/layout.html")
	if err != nil {
		panic(fmt.Errorf("admin: parse layout: %w", err))
	}
	pages := map[string]*pageTemplate{}
	for _, name := range pageNames {
		t, err := htmltemplate.Must(base.Clone()).ParseFS(templates.FS, "admin/"+name+".html")
		if err != nil {
			panic(fmt.Errorf("admin: parse %s: %w", name, err))
		}
		pages[name] = t
	}
	return pages
}

// layout is what every page's template receives: the navigation's state and the page's own data.
type layout struct {
	Title       string
	Section     string
	Livemode    bool
	CSRF        string
	GeneratedAt string
	// Flash is a one-line message about the last action (a replay), Problem one about the request.
	Flash   string
	Problem string
	Body    any
}

// render writes a page. Nothing on it needs scripts; forms may only post back here; it is never
// cached or framed.
func (c *Console) render(ec echo.Context, status int, name, section, title string, body any, flash, problem string) error {
	l := layout{
		Title:       title,
		Section:     section,
		Livemode:    c.d.Livemode,
		CSRF:        auth.CSRFToken(ec),
		GeneratedAt: c.now().UTC().Format(timeLayout),
		Flash:       flash,
		Problem:     problem,
		Body:        body,
	}
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, "layout", l); err != nil {
		return apierr.Internal(err)
	}
	h := ec.Response().Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	// frame-ancestors says it to browsers that read CSP; this to the ones that do not.
	h.Set("X-Frame-Options", "DENY")
	return ec.HTMLBlob(status, buf.Bytes())
}

// message renders a page that only says something (not found, not available).
func (c *Console) message(ec echo.Context, status int, section, title, text string) error {
	return c.render(ec, status, "message", section, title, text, "", "")
}

func (c *Console) unavailable(ec echo.Context, section, what string) error {
	return c.message(ec, http.StatusNotFound, section, what, what+" is not available in this deployment.")
}

const timeLayout = "2006-01-02 15:04:05 UTC"

var funcs = htmltemplate.FuncMap{
	"when":        when,
	"str":         deref,
	"amount":      func(a *int64, cur *string) string { return display.Amount(a, deref(cur)) },
	"money":       func(a int64, cur string) string { return display.Amount(&a, cur) },
	"subURL":      subURL,
	"driftURL":    driftURL,
	"eventURL":    eventURL,
	"findURL":     findURL,
	"customerURL": customerURL,
	"chargeURL":   chargeURL,
	"runURL":      runURL,
	"targetURL":   targetURL,
	"plural":      plural,
	"searchURL":   func(id string) string { return pathEvents + "?q=" + url.QueryEscape(id) },
	"dashboard":   dashboardURL,
	"safeURL":     display.SafeURL,
	"mode": func(live bool) string {
		if live {
			return "live"
		}
		return "test"
	},
}

// when renders a time to the second in UTC; "" for nil.
func when(v any) string {
	switch t := v.(type) {
	case time.Time:
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(timeLayout)
	case *time.Time:
		if t == nil {
			return ""
		}
		return t.UTC().Format(timeLayout)
	}
	return ""
}

// age renders a duration for people: "45s", "12m", "3h 5m", "2d 4h".
func age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		if m := int(d.Minutes()) % 60; m != 0 {
			return fmt.Sprintf("%dh %dm", int(d.Hours()), m)
		}
		return strconv.Itoa(int(d.Hours())) + "h"
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

// seconds renders a lag in seconds: "0.004 s", "2.5 s", "3m".
func seconds(s *float64) string {
	if s == nil {
		return ""
	}
	if *s < 60 {
		return strconv.FormatFloat(*s, 'g', 3, 64) + " s"
	}
	return age(time.Duration(*s * float64(time.Second)))
}

func subURL(id string) string { return pathSubs + "/" + url.PathEscape(id) }

// driftURL is the page of a reconcile drift row's object: a subscription's page, or the catalog
// at the product (a price's row shows the catalog, where its product lists it).
func driftURL(id string) string {
	switch {
	case strings.HasPrefix(id, "prod_"):
		return pathCatalog + "#product-" + url.PathEscape(id)
	case strings.HasPrefix(id, "price_"), strings.HasPrefix(id, "plan_"):
		return pathCatalog
	}
	return subURL(id)
}
func eventURL(id string) string { return pathEvents + "/" + url.PathEscape(id) }
func findURL(id string) string  { return pathFind + "?q=" + url.QueryEscape(id) }

// dashboardURL links an object in Stripe's dashboard; test-mode objects live under /test.
func dashboardURL(kind, id string, live bool) string {
	if id == "" {
		return ""
	}
	u := "https://dashboard.stripe.com"
	if !live {
		u += "/test"
	}
	return u + "/" + kind + "/" + url.PathEscape(id)
}

// plural is "1 attempt", "2 attempts": n and the word that fits it. n is an int, int64 or
// *int64 (nil: "").
func plural(n any, one, many string) string {
	var v int64
	switch t := n.(type) {
	case int:
		v = int64(t)
	case int64:
		v = t
	case *int64:
		if t == nil {
			return ""
		}
		v = *t
	default:
		return ""
	}
	if v == 1 {
		return "1 " + one
	}
	return strconv.FormatInt(v, 10) + " " + many
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// idParam is the path parameter, decoded: echo leaves it escaped when the path has escapes
// other than the default encoding (such as %2F).
func idParam(ec echo.Context) (string, bool) {
	id := ec.Param("id")
	if ec.Request().URL.RawPath == "" {
		return id, id != ""
	}
	decoded, err := url.PathUnescape(id)
	return decoded, err == nil && decoded != ""
}

// modeParam reads a mode filter: "test", "live" or "" (both).
func modeParam(s string) *bool {
	switch s {
	case "live":
		v := true
		return &v
	case "test":
		v := false
		return &v
	}
	return nil
}

// keysetLinks are the links of a page of a newest-first keyset list: back to the newest page,
// one page newer (after its first row) and one older (before its last row), each keeping the
// page's filters. first and last are the cursors of its first and last rows ("" when it has
// none); paged: the page was asked for by a cursor, so an empty one still leads back.
func keysetLinks(path string, filters url.Values, first, last string, hasNewer, hasOlder, paged bool) (newest, newer, older string) {
	with := func(key, cursor string) string {
		f := url.Values{}
		for k, vs := range filters {
			f[k] = vs
		}
		f.Set(key, cursor)
		return withQuery(path, f)
	}
	switch {
	case first == "":
		if paged {
			newest = withQuery(path, filters)
		}
	default:
		if hasNewer {
			newest, newer = withQuery(path, filters), with("after", first)
		}
		if hasOlder {
			older = with("before", last)
		}
	}
	return newest, newer, older
}

// withQuery is path with the non-empty values of q.
func withQuery(path string, q url.Values) string {
	clean := url.Values{}
	for k, vs := range q {
		for _, v := range vs {
			if v != "" {
				clean.Add(k, v)
			}
		}
	}
	if len(clean) == 0 {
		return path
	}
	return path + "?" + clean.Encode()
}

// localPath keeps a redirect target inside the console.
func localPath(p, fallback string) string {
	if strings.HasPrefix(p, "/admin") && !strings.HasPrefix(p, "//") && !strings.ContainsAny(p, "\\\r\n") {
		return p
	}
	return fallback
}
