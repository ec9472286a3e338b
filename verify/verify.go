// Package verify recomputes the state that events drive from the stored event log alone, and
// compares it with the live tables field by field: the operator's proof that what was applied
// is what the log says (`billing verify`).
//
// How: one transaction on the live database, rolled back at the end. In it, every table that
// holds Stripe-mode data is shadowed by a temporary table of the same name (PostgreSQL looks in
// the session's temporary schema first), so the very handlers that process events write to the
// shadows and never touch, nor lock, a live row. The shadows start from what events do not
// write (see Tables: customers and ledger rows come from the API, and are copied with their
// event-driven columns reset; subscriptions, invoices and notices start empty). Then the
// processed events of the mode, and the reads of Stripe that were applied as snapshots
// (subscription_reads), are replayed in the order they were applied — an event's processed_at, a
// read's row time, and the ordering guards' key (created, rank, id) within one instant — each
// under a savepoint, and the shadows are compared with the live tables, whose reads are
// qualified by the live schema.
//
// What cannot be recomputed is said, never guessed:
//   - a column group whose last writer (sub_event_id, inv_event_id, pi_event_id, …) is neither a
//     stored event nor a stored read — an event pruned by retention, or a read of Stripe from
//     before reads were kept — is "unverifiable": counted, and its fields not compared;
//   - a row created before the oldest event still in the log has history that was pruned (its
//     derived fields, such as status_since, depend on it): unverifiable as a whole;
//   - what reads of Stripe said is taken as given: they are Stripe's word, which
//     `billing reconcile --dry-run` checks against Stripe itself.
package verify

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"billing/appevents"
	"billing/billing"
	"billing/webhooks"
)

// Exit codes of `billing verify`.
const (
	ExitEqual       = 0
	ExitDifferences = 1
	ExitError       = 2
)

// SnapshotApplier applies a read of Stripe as the read did (billing.Service).
type SnapshotApplier interface {
	ApplySnapshot(ctx context.Context, tx *gorm.DB, snap billing.Snapshot) (billing.SnapshotOutcome, error)
}

// Deps are what a verification needs. The handlers in Registry must be built so that they never
// call out of the process (their job inserter a Discard, no Stripe client where one is optional):
// verify runs them on the shadows only.
type Deps struct {
	DB        *gorm.DB
	Registry  *webhooks.Registry
	Snapshots SnapshotApplier
	// Livemode is the mode verified (stripe.mode): only its events, reads and rows.
	Livemode bool
	// Strict counts the differences of History columns as differences (see Group.History).
	Strict bool
	Logger *slog.Logger
}

// Difference is one field (or one row) where the live tables and the log's replay disagree.
type Difference struct {
	Table string
	Key   string
	// Field is "" for a row that exists on one side only.
	Field string
	Live  *string
	Log   *string
	// History: a when-it-began column (Group.History).
	History bool
}

// Line is the difference as `billing verify` prints it.
func (d Difference) Line() string {
	if d.Field == "" {
		if d.Live == nil {
			return fmt.Sprintf("%s %s: only in the log's replay (no live row)", d.Table, d.Key)
		}
		return fmt.Sprintf("%s %s: only in the live tables (the log does not make it)", d.Table, d.Key)
	}
	field := d.Field
	if d.History {
		field += " (history)"
	}
	return fmt.Sprintf("%s %s %s: live=%s log=%s", d.Table, d.Key, field, quote(d.Live), quote(d.Log))
}

func quote(p *string) string {
	if p == nil {
		return "NULL"
	}
	return fmt.Sprintf("%q", *p)
}

// Report is the outcome of a verification.
type Report struct {
	// Events and Reads replayed.
	Events, Reads int
	// Rows compared (live rows of the mode in the compared tables, plus rows only the replay made).
	Rows int
	// Unverifiable counts the row groups whose history is not in the log (see the package doc).
	Unverifiable int
	// ReplayErrors counts events or reads that were applied live but whose handler failed in
	// the replay; each is also a difference.
	ReplayErrors int
	Differences  []Difference
	// History are the differences of History columns, when not Strict.
	History []Difference
	// AppEvents is the check that every change of an entitlement answer was told (nil: not run).
	AppEvents *appevents.CheckReport
}

// untold counts the users whose answer differs from the one told and is not a time-driven
// change whose moment has just come.
func (r Report) untold() (lost, due int) {
	if r.AppEvents == nil {
		return 0, 0
	}
	for _, u := range r.AppEvents.Untold {
		if u.Due {
			due++
		} else {
			lost++
		}
	}
	return lost, due
}

// CheckAppEvents runs the app events' check into the report, a line per finding on out.
func (r *Report) CheckAppEvents(ctx context.Context, db *gorm.DB, livemode bool, now time.Time, answer appevents.Answerer,
	baseline func(string) json.RawMessage, out io.Writer) error {
	c, err := appevents.Check(ctx, db, livemode, now, answer, baseline)
	if err != nil {
		return err
	}
	for _, u := range c.Untold {
		what := "changed with no event"
		if u.Due {
			what = "changed by time just now; the sweeper tells it"
		}
		told := u.Told
		if told == "" {
			told = "(nothing yet)"
		}
		fmt.Fprintf(out, "app_events user %s: entitlement %s: told=%s now=%s\n", u.UserID, what, told, u.Now)
	}
	for _, g := range c.Gaps {
		fmt.Fprintf(out, "app_events user %s: the sequences have a gap or a repeat\n", g)
	}
	r.AppEvents = c
	return nil
}

// Line is the summary line.
func (r Report) Line() string {
	line := fmt.Sprintf("verify: events=%d reads=%d rows=%d differences=%d history=%d unverifiable=%d replay_errors=%d",
		r.Events, r.Reads, r.Rows, len(r.Differences), len(r.History), r.Unverifiable, r.ReplayErrors)
	if r.AppEvents != nil {
		lost, due := r.untold()
		line += fmt.Sprintf(" app_event_users=%d untold=%d untold_due=%d sequence_gaps=%d", r.AppEvents.Users, lost, due, len(r.AppEvents.Gaps))
	}
	return line
}

// ExitCode is 0 when the live tables are what the log makes, 1 otherwise.
func (r Report) ExitCode() int {
	if lost, _ := r.untold(); len(r.Differences) > 0 || lost > 0 || (r.AppEvents != nil && len(r.AppEvents.Gaps) > 0) {
		return ExitDifferences
	}
	return ExitEqual
}

// Run verifies the mode's state. Differences are written to out as they are found (one line
// each); the summary is the caller's to print. An error means the verification could not be
// done (the report is then incomplete).
func Run(ctx context.Context, d Deps, out io.Writer) (Report, error) {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	var rep Report
	// REPEATABLE READ: the log, the reads and the live rows are read from one snapshot, so an
	// event processed while verify runs is either in both the log and the live rows, or in neither.
	tx := d.DB.WithContext(ctx).Begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if tx.Error != nil {
		return rep, fmt.Errorf("begin: %w", tx.Error)
	}
	defer tx.Rollback()

	var schema string
	if err := tx.Raw(`SELECT current_schema()`).Scan(&schema).Error; err != nil || schema == "" {
		return rep, fmt.Errorf("find the live schema: %v", errors.Join(err, errors.New("no current schema")))
	}
	live := func(table string) string { return quoteIdent(schema) + "." + quoteIdent(table) }

	if err := shadow(ctx, tx, schema, d.Livemode); err != nil {
		return rep, err
	}
	seen, err := replay(ctx, tx, d, live, &rep, out)
	if err != nil {
		return rep, err
	}
	horizon, err := logHorizon(ctx, tx, live, d.Livemode)
	if err != nil {
		return rep, err
	}
	for _, t := range Tables {
		if len(t.Groups) == 0 {
			continue
		}
		if err := compare(ctx, tx, t, live, d.Livemode, d.Strict, seen, horizon, &rep, out); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// logItem is one entry of the replay: a stored event or a stored read.
type logItem struct {
	read       bool
	id         string
	typ        string
	apiVersion string
	payload    []byte
	invoice    []byte
	fetchedAt  time.Time
	created    time.Time
	// applied is when the service applied it (an event's processed_at, a read's row): the log's
	// order, which the when-it-began columns depend on.
	applied time.Time
	rank    int
}

// replay applies the log to the shadows in the order it was applied and returns the ids it applied
// (events' ids, reads' sources): the writers a live row may name.
func replay(ctx context.Context, tx *gorm.DB, d Deps, live func(string) string, rep *Report, out io.Writer) (map[string]bool, error) {
	mode := "false"
	if d.Livemode {
		mode = "true"
	}
	// A cursor, so that a log of millions of events is read a page at a time. Ordered by when
	// each was applied: the guards make the order irrelevant to every other column, and the
	// when-it-began columns are what the handlers inferred from exactly that order. Within one
	// instant, by the guards' key; the rank, which needs the object, is sorted in Go.
	err := tx.Exec(`DECLARE verify_log NO SCROLL CURSOR FOR SELECT * FROM (
		SELECT false AS read, e.event_id AS id, e.type, coalesce(e.api_version, '') AS api_version, e.payload::text AS payload,
		       NULL::text AS invoice, NULL::timestamptz AS fetched_at,
		       CASE WHEN jsonb_typeof(e.payload->'created') = 'number' THEN to_timestamp((e.payload->>'created')::bigint)
		            ELSE coalesce(e.event_created, 'epoch') END AS created,
		       coalesce(e.processed_at, e.received_at) AS applied
		FROM ` + live("webhook_events") + ` e
		WHERE e.status = 'processed' AND e.livemode = ` + mode + `
		UNION ALL
		SELECT true, r.source, '', '', r.subscription::text, r.latest_invoice::text, r.fetched_at, date_trunc('second', r.fetched_at),
		       r.created_at
		FROM ` + live("subscription_reads") + ` r
		WHERE r.livemode = ` + mode + `
		) entries ORDER BY applied, created, id COLLATE "C"`).Error
	if err != nil {
		return nil, fmt.Errorf("read the log: %w", err)
	}
	seen := map[string]bool{}
	var second []logItem
	flush := func() error {
		slices.SortStableFunc(second, func(a, b logItem) int {
			return cmp.Or(a.created.Compare(b.created), cmp.Compare(a.rank, b.rank), strings.Compare(a.id, b.id))
		})
		for _, it := range second {
			if err := apply(ctx, tx, d, it, rep, out); err != nil {
				return err
			}
			seen[it.id] = true
		}
		second = second[:0]
		return nil
	}
	for {
		page, err := fetchPage(tx, d.Livemode)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		// The page is read in full before anything is applied: the connection runs one
		// statement at a time.
		for _, it := range page {
			if len(second) > 0 && !second[0].applied.Equal(it.applied) {
				if err := flush(); err != nil {
					return nil, err
				}
			}
			second = append(second, it)
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if err := tx.Exec(`CLOSE verify_log`).Error; err != nil {
		return nil, fmt.Errorf("read the log: %w", err)
	}
	return seen, nil
}

func fetchPage(tx *gorm.DB, livemode bool) ([]logItem, error) {
	rows, err := tx.Raw(`FETCH 500 FROM verify_log`).Rows()
	if err != nil {
		return nil, fmt.Errorf("read the log: %w", err)
	}
	defer rows.Close()
	var page []logItem
	for rows.Next() {
		var it logItem
		var payload string
		var invoice sql.NullString
		var fetched sql.NullTime
		if err := rows.Scan(&it.read, &it.id, &it.typ, &it.apiVersion, &payload, &invoice, &fetched, &it.created, &it.applied); err != nil {
			return nil, fmt.Errorf("read the log: %w", err)
		}
		it.payload = []byte(payload)
		if invoice.Valid {
			it.invoice = []byte(invoice.String)
		}
		it.fetchedAt = fetched.Time
		it.created = it.created.UTC()
		if it.read {
			it.rank = billing.SnapshotRank
		} else if ev, err := webhooks.DecodeStored(it.id, it.typ, livemode, it.apiVersion, it.payload); err == nil {
			it.rank = billing.ReplayRank(it.typ, ev.Object)
		}
		page = append(page, it)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the log: %w", err)
	}
	return page, nil
}

// apply replays one item under a savepoint: a handler that fails in the replay (the event was
// applied live) is a difference, and leaves the shadows as they were before it.
func apply(ctx context.Context, tx *gorm.DB, d Deps, it logItem, rep *Report, out io.Writer) error {
	if err := tx.Exec(`SAVEPOINT verify_item`).Error; err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	var err error
	kind := "event"
	if it.read {
		kind = "read"
		rep.Reads++
		_, err = d.Snapshots.ApplySnapshot(ctx, tx, billing.Snapshot{
			Livemode: d.Livemode, Subscription: json.RawMessage(it.payload), LatestInvoice: json.RawMessage(it.invoice),
			FetchedAt: it.fetchedAt, Source: it.id,
		})
	} else {
		rep.Events++
		err = handle(ctx, tx, d, it)
	}
	if err == nil {
		if err := tx.Exec(`RELEASE SAVEPOINT verify_item`).Error; err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if rb := tx.Exec(`ROLLBACK TO SAVEPOINT verify_item`).Error; rb != nil {
		return fmt.Errorf("%s %s: %w (and the rollback to its savepoint: %v)", kind, it.id, err, rb)
	}
	rep.ReplayErrors++
	msg := err.Error()
	diff := Difference{Table: "log", Key: it.id, Field: "replay", Live: ptr("applied"), Log: &msg}
	rep.Differences = append(rep.Differences, diff)
	fmt.Fprintln(out, diff.Line())
	return nil
}

func handle(ctx context.Context, tx *gorm.DB, d Deps, it logItem) (err error) {
	h, ok := d.Registry.Lookup(it.typ)
	if !ok {
		return fmt.Errorf("no handler is registered for event type %q (the event was processed by another version)", it.typ)
	}
	ev, err := webhooks.DecodeStored(it.id, it.typ, d.Livemode, it.apiVersion, it.payload)
	if err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler for %s panicked: %v", it.typ, r)
		}
	}()
	return h.HandleEvent(ctx, tx, ev)
}

func ptr(s string) *string { return &s }

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
