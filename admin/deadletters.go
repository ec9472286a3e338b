package admin

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"billing/internal/database"
	"billing/webhooks"
)

// deadLettersShown is the dead-letter page's page size; replayTypeMax is how many one "replay
// all of a type" replays (each in its own transaction; the page says what is left).
const (
	deadLettersShown = 100
	replayTypeMax    = 1000
)

type deadLettersPage struct {
	Type                string
	Types               []webhooks.DeadLetterType
	Rows                []webhooks.DeadLetter
	NewestURL, OlderURL string
}

func (c *Console) getDeadLetters(ec echo.Context) error {
	if c.d.Events == nil {
		return c.unavailable(ec, "dead-letters", "The dead-letter list")
	}
	ctx := ec.Request().Context()
	v := &deadLettersPage{Type: strings.TrimSpace(ec.QueryParam("type"))}
	var err error
	if v.Types, err = c.d.Events.DeadLetterTypes(ctx); err != nil {
		return database.APIError(err, "count dead letters")
	}
	dq := webhooks.DeadLetterQuery{Type: v.Type, Limit: deadLettersShown + 1}
	problem := ""
	if s := ec.QueryParam("before"); s != "" {
		cur, err := webhooks.ParseEventCursor(s)
		if err != nil {
			problem = "The page link is damaged: showing the newest dead letters."
		} else {
			dq.Before = &cur
			v.NewestURL = withQuery(pathDeadLetters, url.Values{"type": {v.Type}})
		}
	}
	if v.Rows, err = c.d.Events.DeadLetterList(ctx, dq); err != nil {
		return database.APIError(err, "list dead letters")
	}
	if len(v.Rows) > deadLettersShown {
		v.Rows = v.Rows[:deadLettersShown]
		last := v.Rows[len(v.Rows)-1]
		v.OlderURL = withQuery(pathDeadLetters, url.Values{"type": {v.Type},
			"before": {webhooks.EventCursor{ReceivedAt: last.DeadAt, EventID: last.EventID}.String()}})
	}
	q := ec.QueryParams()
	flash := ""
	switch {
	case q.Get("replayed") != "":
		flash = "Event " + q.Get("replayed") + " was queued again."
	case q.Has("replayed_type"):
		flash = "Replayed " + q.Get("n") + " dead letters of type " + q.Get("replayed_type") + "; " + q.Get("left") + " of those confirmed are left."
	}
	return c.render(ec, http.StatusOK, "deadletters", "dead-letters", "Dead letters", v, flash, problem)
}

func (c *Console) postDeadLetterReplay(ec echo.Context) error {
	if c.d.Events == nil {
		return c.unavailable(ec, "dead-letters", "The dead-letter list")
	}
	id := ec.FormValue("event_id")
	status, err := c.d.Events.Replay(ec.Request().Context(), id)
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		return c.message(ec, http.StatusNotFound, "dead-letters", "Not found", "No event "+id+" is stored.")
	case errors.Is(err, webhooks.ErrNotReplayable):
		return c.message(ec, http.StatusConflict, "dead-letters", "Not replayed",
			"Event "+id+" is "+status+": only a failed event can be replayed (someone may have replayed it already).")
	case err != nil:
		return database.APIError(err, "replay event")
	}
	back := localPath(ec.FormValue("back"), pathDeadLetters)
	sep := "?"
	if strings.Contains(back, "?") {
		sep = "&"
	}
	return ec.Redirect(http.StatusSeeOther, back+sep+"replayed="+url.QueryEscape(id))
}

type confirmPage struct {
	Type   string
	Count  int64
	Cutoff string
	Sample []webhooks.DeadLetter
	Max    int64
}

// getReplayType is the confirmation step: what "replay all" would replay. The moment it was
// shown bounds the replay, so that events that fail again meanwhile are not replayed in a loop.
func (c *Console) getReplayType(ec echo.Context) error {
	if c.d.Events == nil {
		return c.unavailable(ec, "dead-letters", "The dead-letter list")
	}
	ctx := ec.Request().Context()
	typ := strings.TrimSpace(ec.QueryParam("type"))
	if typ == "" {
		return ec.Redirect(http.StatusSeeOther, pathDeadLetters)
	}
	cutoff := c.now().UTC()
	q := webhooks.DeadLetterQuery{Type: typ, DeadAtOrBefore: cutoff}
	n, err := c.d.Events.CountDeadLetters(ctx, q)
	if err != nil {
		return database.APIError(err, "count dead letters")
	}
	q.Limit = 20
	sample, err := c.d.Events.DeadLetterList(ctx, q)
	if err != nil {
		return database.APIError(err, "list dead letters")
	}
	v := &confirmPage{Type: typ, Count: n, Cutoff: cutoff.Format(time.RFC3339Nano), Sample: sample, Max: replayTypeMax}
	return c.render(ec, http.StatusOK, "confirm", "dead-letters", "Replay all "+typ, v, "", "")
}

func (c *Console) postReplayType(ec echo.Context) error {
	if c.d.Events == nil {
		return c.unavailable(ec, "dead-letters", "The dead-letter list")
	}
	typ := strings.TrimSpace(ec.FormValue("type"))
	cutoff, err := time.Parse(time.RFC3339Nano, ec.FormValue("cutoff"))
	if typ == "" || err != nil || ec.FormValue("confirm") != "yes" {
		return c.message(ec, http.StatusBadRequest, "dead-letters", "Not replayed",
			"The confirmation is incomplete: open the dead-letter page and confirm again.")
	}
	replayed, left, err := c.d.Events.ReplayDeadLetters(ec.Request().Context(),
		webhooks.DeadLetterQuery{Type: typ, DeadAtOrBefore: cutoff}, replayTypeMax)
	if err != nil {
		return database.APIError(err, "replay dead letters")
	}
	c.log.InfoContext(ec.Request().Context(), "dead letters replayed by type", "type", typ, "replayed", replayed, "left", left)
	return ec.Redirect(http.StatusSeeOther, withQuery(pathDeadLetters, url.Values{
		"replayed_type": {typ}, "n": {strconv.Itoa(replayed)}, "left": {strconv.FormatInt(left, 10)}}))
}
