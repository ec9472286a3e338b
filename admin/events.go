package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"billing/internal/database"
	"billing/webhooks"
)

// eventsPerPage is the event log's page size.
const eventsPerPage = 50

var eventStatuses = []string{"received", "processed", "failed", "ignored"}

type eventsPage struct {
	Type, Status, Mode, From, To, Q string
	Types, Statuses                 []string
	Rows                            []eventRow
	NewestURL, NewerURL, OlderURL   string
}

type eventRow struct {
	webhooks.LoggedEvent
	// SubscriptionID is the subscription the event is about: its object, or its object's.
	SubscriptionID string
}

func rowOf(e webhooks.LoggedEvent) eventRow {
	r := eventRow{LoggedEvent: e}
	switch {
	case deref(e.ObjectType) == "subscription":
		r.SubscriptionID = deref(e.ObjectID)
	case e.SubscriptionID != nil:
		r.SubscriptionID = *e.SubscriptionID
	}
	return r
}

func (c *Console) getEvents(ec echo.Context) error {
	if c.d.Events == nil {
		return c.unavailable(ec, "events", "The event log")
	}
	p := ec.QueryParams()
	v := &eventsPage{
		Type: strings.TrimSpace(p.Get("type")), Status: p.Get("status"), Mode: p.Get("mode"),
		From: p.Get("from"), To: p.Get("to"), Q: strings.TrimSpace(p.Get("q")),
		Types: c.d.Events.HandledTypes(), Statuses: eventStatuses,
	}
	q := webhooks.EventQuery{Type: v.Type, Livemode: modeParam(v.Mode), Search: v.Q, Limit: eventsPerPage}
	var problems []string
	if v.Status != "" {
		if !isEventStatus(v.Status) {
			problems = append(problems, "Unknown status "+v.Status+": not filtered by status.")
			v.Status = ""
		}
		q.Status = v.Status
	}
	if d, ok := parseDay(v.From); ok {
		q.ReceivedFrom = d
	} else if v.From != "" {
		problems = append(problems, "From is not a date (YYYY-MM-DD): not filtered by it.")
	}
	if d, ok := parseDay(v.To); ok {
		q.ReceivedTo = d.Add(24 * time.Hour) // the whole day
	} else if v.To != "" {
		problems = append(problems, "To is not a date (YYYY-MM-DD): not filtered by it.")
	}
	for key, dst := range map[string]**webhooks.EventCursor{"before": &q.Before, "after": &q.After} {
		if s := p.Get(key); s != "" && q.Before == nil && q.After == nil {
			cur, err := webhooks.ParseEventCursor(s)
			if err != nil {
				problems = append(problems, "The page link is damaged: showing the newest events.")
				continue
			}
			*dst = &cur
		}
	}
	page, err := c.d.Events.SearchEvents(ec.Request().Context(), q)
	if err != nil {
		return database.APIError(err, "search events")
	}
	for _, e := range page.Events {
		v.Rows = append(v.Rows, rowOf(e))
	}
	filters := url.Values{"type": {v.Type}, "status": {v.Status}, "mode": {v.Mode}, "from": {v.From}, "to": {v.To}, "q": {v.Q}}
	var first, last string
	if n := len(page.Events); n > 0 {
		first = webhooks.EventCursor{ReceivedAt: page.Events[0].ReceivedAt, EventID: page.Events[0].EventID}.String()
		last = webhooks.EventCursor{ReceivedAt: page.Events[n-1].ReceivedAt, EventID: page.Events[n-1].EventID}.String()
	}
	v.NewestURL, v.NewerURL, v.OlderURL = keysetLinks(pathEvents, filters, first, last, page.HasNewer, page.HasOlder,
		q.Before != nil || q.After != nil)
	return c.render(ec, http.StatusOK, "events", "events", "Event log", v, "", strings.Join(problems, " "))
}

func isEventStatus(s string) bool {
	for _, st := range eventStatuses {
		if s == st {
			return true
		}
	}
	return false
}

func parseDay(s string) (time.Time, bool) {
	if s == "" {
		return time.Time{}, false
	}
	t, err := time.Parse("2006-01-02", s)
	return t, err == nil
}

type eventPage struct {
	E              *webhooks.EventDetail
	SubscriptionID string
	Payload        string
	Replayable     bool
	ReplayURL      string
}

func (c *Console) getEvent(ec echo.Context) error {
	if c.d.Events == nil {
		return c.unavailable(ec, "events", "The event log")
	}
	id, ok := idParam(ec)
	if !ok {
		return c.message(ec, http.StatusNotFound, "events", "Not found", "That is not an event id.")
	}
	d, err := c.d.Events.EventDetail(ec.Request().Context(), id)
	if err != nil {
		return database.APIError(err, "load event")
	}
	if d == nil {
		return c.message(ec, http.StatusNotFound, "events", "Not found", "No event "+id+" is stored.")
	}
	v := &eventPage{E: d, SubscriptionID: rowOf(d.LoggedEvent).SubscriptionID, Payload: pretty(d.Payload),
		Replayable: d.Status == "failed", ReplayURL: eventURL(d.EventID) + "/replay"}
	flash := ""
	if ec.QueryParam("replayed") == "1" {
		flash = "The event was queued again: a worker processes it shortly."
	}
	return c.render(ec, http.StatusOK, "event", "events", "Event "+d.EventID, v, flash, "")
}

func pretty(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

func (c *Console) postEventReplay(ec echo.Context) error {
	if c.d.Events == nil {
		return c.unavailable(ec, "events", "The event log")
	}
	id, ok := idParam(ec)
	if !ok {
		return c.message(ec, http.StatusNotFound, "events", "Not found", "That is not an event id.")
	}
	status, err := c.d.Events.Replay(ec.Request().Context(), id)
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		return c.message(ec, http.StatusNotFound, "events", "Not found", "No event "+id+" is stored.")
	case errors.Is(err, webhooks.ErrNotReplayable):
		return c.message(ec, http.StatusConflict, "events", "Not replayed",
			"Event "+id+" is "+status+": only a failed event can be replayed.")
	case err != nil:
		return database.APIError(err, "replay event")
	}
	return ec.Redirect(http.StatusSeeOther, eventURL(id)+"?replayed=1")
}
