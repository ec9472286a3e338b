package verify

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
)

// Table says how verify shadows one live table and what it compares in it.
//
// Every table of the live schema with a livemode column is shadowed, so that no handler writes
// to (or locks) a live row during the replay; a table not listed here is shadowed with a copy of
// its live rows and not compared. A package whose handlers drive a table adds an entry here
// (usage, features: their event-driven columns as a Group, with the column naming the group's
// last writer).
type Table struct {
	Name string
	// Copy fills the shadow with the live rows (of both modes: handlers look at the other mode's
	// rows to refuse an event that names one); false starts it empty.
	Copy bool
	// Reset is run on the shadow after the copy: it puts back what the table held before any
	// event, so that the replay recomputes the event-driven columns. "" for none.
	Reset string
	// MadeByLog: the rows are made by events and reads alone, so a row created before the oldest
	// entry still in the log has history that was pruned (unverifiable as a whole).
	MadeByLog bool
	// Key is the primary key; Groups what is compared (nil: not compared).
	Key    []string
	Groups []Group
	// Skip lists the columns deliberately not compared (written by the API, a clock, or
	// bookkeeping); every other column must be in a group (a test holds the list complete).
	Skip []string
}

// Group is a set of columns that one ordering guard writes, with the column that names the
// group's last writer (an event id, or a read's source); "" when the guard keeps none.
type Group struct {
	Writer string
	Fields []string
	// When names a boolean column: the group means something only while it is true (on either
	// side), and is compared only then. "" compares always.
	When string
	// History marks columns whose differences are reported apart (Report.History) and count as
	// differences only under Strict: for a column the log's order cannot settle. None is marked
	// today: the when-it-began columns follow the order of application, which the replay follows.
	History bool
}

// logTables are the log itself and the bookkeeping of reconciliation: read from the live schema,
// never shadowed.
var logTables = map[string]bool{
	"webhook_events": true, "webhook_dead_letters": true, "subscription_reads": false,
	"reconcile_runs": true, "reconcile_drift": true, "reconcile_schedule": true,
}

var clock = []string{"created_at", "updated_at"}

// Tables are the tables verify recomputes. Subscriptions, invoices and notices are made by events
// (and reads) alone, so their shadows start empty; customers and ledger rows are made by the API,
// so their shadows are copies with the event-driven columns reset.
var Tables = []Table{
	{
		Name: "subscriptions", MadeByLog: true,
		Key: []string{"subscription_id"},
		Groups: []Group{
			{Writer: "sub_event_id", Fields: []string{
				"stripe_customer_id", "livemode", "status", "price_id", "current_period_start", "current_period_end",
				"cancel_at_period_end", "cancel_at", "canceled_at", "ended_at", "trial_start", "trial_end",
				"pause_collection_behavior", "pause_collection_resumes_at",
				"sub_event_id", "sub_event_type", "sub_event_created", "sub_event_rank", "trial_will_end_at",
			}},
			// When the status began depends on the order in which events were applied; the replay
			// follows that order (the log's), so they are compared like the rest.
			{Writer: "sub_event_id", Fields: []string{"status_since", "status_other_at"}},
			{Writer: "inv_event_id", Fields: []string{
				"payment_hold", "latest_invoice_id", "attempt_count", "next_payment_attempt",
				"amount_due", "currency", "hosted_invoice_url", "inv_event_id", "inv_event_type", "inv_event_created",
				"inv_event_rank", "inv_invoice_created",
			}},
			// The hold's own columns: what a lifted hold leaves behind in them is read by nothing
			// (every reader looks at them only while payment_hold is true), so only a hold in
			// force on either side compares them.
			{Writer: "inv_event_id", When: "payment_hold", Fields: []string{
				"payment_hold_invoice_created", "payment_hold_kind", "payment_hold_billing_reason",
			}},
			{Writer: "inv_event_id", When: "payment_hold", Fields: []string{"payment_hold_since"}},
		},
		// The re-read's plan is bookkeeping: the sweep marks it queued, which a replay does not.
		Skip: append([]string{"renewal_reread_due", "renewal_reread_queued"}, clock...),
	},
	{
		Name: "invoices", MadeByLog: true,
		Key: []string{"invoice_id"},
		Groups: []Group{{Writer: "inv_event_id", Fields: []string{
			"livemode", "stripe_customer_id", "subscription_id", "number", "status", "billing_reason", "amount_due",
			"amount_paid", "currency", "period_start", "period_end", "hosted_invoice_url", "invoice_pdf", "created",
			"inv_event_id", "inv_event_type", "inv_event_created", "inv_event_rank",
		}}},
		Skip: clock,
	},
	{
		// The link is the API's; events only delete it (and bring email and name, which a PUT
		// may have changed since: not comparable from the log alone).
		Name: "customers", Copy: true,
		Reset:  `UPDATE pg_temp.customers SET deleted_at = NULL, cus_event_id = NULL, cus_event_created = NULL, cus_event_rank = NULL /* all modes */`,
		Key:    []string{"user_id"},
		Groups: []Group{{Writer: "cus_event_id", Fields: []string{"deleted_at"}}},
		Skip: append([]string{"stripe_customer_id", "email", "name", "livemode", "cus_event_id", "cus_event_created", "cus_event_rank"},
			clock...),
	},
	{
		// A charge's status is what POST answered (its stored answer) until payment_intent.*
		// events settle it; charge.refunded brings amount_refunded.
		Name: "charges", Copy: true,
		Reset: `UPDATE pg_temp.charges SET
			status = CASE WHEN state = 'pending' THEN NULL WHEN answer->'body' ? 'status' THEN answer->'body'->>'status' ELSE status END,
			pi_event_id = NULL, pi_event_created = NULL, pi_event_rank = NULL, amount_refunded = NULL /* all modes */`,
		Key:    []string{"order_id"},
		Groups: []Group{{Writer: "pi_event_id", Fields: []string{"status"}}, {Fields: []string{"amount_refunded"}}},
		Skip: append([]string{"user_id", "stripe_customer_id", "amount", "currency", "description", "request_hash",
			"idempotency_key", "livemode", "state", "payment_intent_id", "payment_method_id", "answer", "error_code",
			"decline_code", "attempts", "last_attempt_at", "completed_at", "pi_event_id", "pi_event_created", "pi_event_rank"},
			clock...),
	},
	{
		Name: "refunds", Copy: true,
		Reset: `UPDATE pg_temp.refunds SET
			status = CASE WHEN state = 'pending' THEN NULL WHEN answer->'body' ? 'status' THEN answer->'body'->>'status' ELSE status END,
			re_event_id = NULL, re_event_created = NULL, re_event_rank = NULL /* all modes */`,
		Key:    []string{"order_id", "refund_id"},
		Groups: []Group{{Writer: "re_event_id", Fields: []string{"status"}}},
		Skip: append([]string{"amount", "reason", "request_hash", "idempotency_key", "livemode", "state", "stripe_refund_id",
			"answer", "error_code", "attempts", "last_attempt_at", "completed_at", "re_event_id", "re_event_created",
			"re_event_rank", "failure_reason"},
			clock...),
	},
	// Made by events, not compared: whether a notice is due depends on the clock of the moment
	// (a trial that has ended by now gets none), which a replay cannot reproduce.
	{Name: "notices"},
	{Name: "subscription_reads"},
	{Name: "checkout_sessions", Copy: true},
}

func tableSpec(name string) (Table, bool) {
	for _, t := range Tables {
		if t.Name == name {
			return t, true
		}
	}
	return Table{}, false
}

// shadow creates the temporary tables that stand in for the live ones during the replay.
func shadow(ctx context.Context, tx *gorm.DB, schema string, livemode bool) error {
	var names []string
	if err := tx.WithContext(ctx).Raw(`
		SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
		  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'livemode' AND NOT a.attisdropped)
		ORDER BY c.relname`, schema).Scan(&names).Error; err != nil {
		return fmt.Errorf("list the live tables: %w", err)
	}
	for _, name := range names {
		if logTables[name] {
			continue
		}
		spec, known := tableSpec(name)
		if !known {
			spec = Table{Name: name, Copy: true}
		}
		liveName := quoteIdent(schema) + "." + quoteIdent(name)
		stmts := []string{fmt.Sprintf(`CREATE TEMPORARY TABLE %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES INCLUDING IDENTITY) ON COMMIT DROP`,
			quoteIdent(name), liveName)}
		if spec.Copy {
			stmts = append(stmts, fmt.Sprintf(`INSERT INTO pg_temp.%s SELECT * FROM %s /* all modes */`, quoteIdent(name), liveName))
		}
		if spec.Reset != "" {
			stmts = append(stmts, spec.Reset)
		}
		for _, q := range stmts {
			if err := tx.WithContext(ctx).Exec(q).Error; err != nil {
				return fmt.Errorf("shadow %s: %w", name, err)
			}
		}
		if err := ownSequences(ctx, tx, name); err != nil {
			return err
		}
	}
	return nil
}

// ownSequences gives the shadow's serial columns a temporary sequence: the copied default would
// draw from the live table's.
func ownSequences(ctx context.Context, tx *gorm.DB, name string) error {
	var cols []string
	if err := tx.WithContext(ctx).Raw(`
		SELECT a.attname FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = to_regclass('pg_temp.' || quote_ident($1)) AND pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%'`, name).
		Scan(&cols).Error; err != nil {
		return fmt.Errorf("shadow %s: sequences: %w", name, err)
	}
	for _, col := range cols {
		seq := quoteIdent("verify_" + name + "_" + col)
		for _, q := range []string{
			`CREATE TEMPORARY SEQUENCE ` + seq,
			fmt.Sprintf(`SELECT setval('pg_temp.%[1]s', coalesce((SELECT max(%[2]s) FROM pg_temp.%[3]s), 0) + 1, false)`, seq, quoteIdent(col), quoteIdent(name)),
			fmt.Sprintf(`ALTER TABLE pg_temp.%s ALTER COLUMN %s SET DEFAULT nextval('pg_temp.%s')`, quoteIdent(name), quoteIdent(col), seq),
		} {
			if err := tx.WithContext(ctx).Exec(q).Error; err != nil {
				return fmt.Errorf("shadow %s: sequence of %s: %w", name, col, err)
			}
		}
	}
	return nil
}

// logHorizon is when the oldest entry still in the log arrived (an event processed or ignored:
// what retention prunes; or a read), or the zero time for an empty log. A row that events make,
// created before it, may have history that was pruned.
func logHorizon(ctx context.Context, tx *gorm.DB, live func(string) string, livemode bool) (time.Time, error) {
	var at []time.Time
	if err := tx.WithContext(ctx).Raw(`SELECT min(at) FROM (
		  SELECT min(received_at) AS at FROM `+live("webhook_events")+` WHERE status IN ('processed', 'ignored') AND livemode = $1
		  UNION ALL SELECT min(created_at) FROM `+live("subscription_reads")+` WHERE livemode = $1
		) h HAVING min(at) IS NOT NULL`, livemode).Scan(&at).Error; err != nil {
		return time.Time{}, fmt.Errorf("find the log's horizon: %w", err)
	}
	if len(at) == 0 {
		return time.Time{}, nil
	}
	return at[0], nil
}

// compare compares the shadow of t with its live table, for rows of the mode, and appends the
// differences to rep (and prints them on out).
func compare(ctx context.Context, tx *gorm.DB, t Table, live func(string) string, livemode, strict bool, seen map[string]bool,
	horizon time.Time, rep *Report, out io.Writer) error {
	var fields []string
	var writers []string
	for _, g := range t.Groups {
		fields = append(fields, g.Fields...)
		if g.Writer != "" {
			writers = append(writers, g.Writer)
		}
	}
	var sel []string
	for _, k := range t.Key {
		sel = append(sel, fmt.Sprintf("coalesce(l.%[1]s, t.%[1]s)::text", quoteIdent(k)))
	}
	keyJoin := make([]string, len(t.Key))
	for i, k := range t.Key {
		keyJoin[i] = fmt.Sprintf("l.%[1]s = t.%[1]s", quoteIdent(k))
	}
	sel = append(sel, "l."+quoteIdent(t.Key[0])+" IS NOT NULL", "t."+quoteIdent(t.Key[0])+" IS NOT NULL", "l.created_at")
	for _, w := range writers {
		sel = append(sel, "l."+quoteIdent(w)+"::text")
	}
	var whens []string
	for _, g := range t.Groups {
		if g.When != "" && !slices.Contains(whens, g.When) {
			whens = append(whens, g.When)
		}
	}
	for _, w := range whens {
		sel = append(sel, fmt.Sprintf("coalesce(l.%[1]s, false) OR coalesce(t.%[1]s, false)", quoteIdent(w)))
	}
	var distinct []string
	for _, f := range fields {
		sel = append(sel, "l."+quoteIdent(f)+"::text", "t."+quoteIdent(f)+"::text")
		distinct = append(distinct, fmt.Sprintf("l.%[1]s IS DISTINCT FROM t.%[1]s", quoteIdent(f)))
	}
	from := fmt.Sprintf(`(SELECT * FROM %s WHERE livemode = $1) l FULL JOIN (SELECT * FROM pg_temp.%s WHERE livemode = $1) t ON %s`,
		live(t.Name), quoteIdent(t.Name), strings.Join(keyJoin, " AND "))
	var n int
	if err := tx.WithContext(ctx).Raw(`SELECT count(*) FROM `+from, livemode).Scan(&n).Error; err != nil {
		return fmt.Errorf("compare %s: %w", t.Name, err)
	}
	rep.Rows += n
	q := `SELECT ` + strings.Join(sel, ", ") + ` FROM ` + from + `
		WHERE l.` + quoteIdent(t.Key[0]) + ` IS NULL OR t.` + quoteIdent(t.Key[0]) + ` IS NULL OR ` + strings.Join(distinct, " OR ") + `
		ORDER BY 1`
	rows, err := tx.WithContext(ctx).Raw(q, livemode).Rows()
	if err != nil {
		return fmt.Errorf("compare %s: %w", t.Name, err)
	}
	defer rows.Close()
	for rows.Next() {
		keys := make([]string, len(t.Key))
		var inLive, inLog bool
		var created *time.Time
		ws := make([]*string, len(writers))
		on := make([]bool, len(whens))
		vals := make([]*string, 2*len(fields))
		dest := []any{}
		for i := range keys {
			dest = append(dest, &keys[i])
		}
		dest = append(dest, &inLive, &inLog, &created)
		for i := range ws {
			dest = append(dest, &ws[i])
		}
		for i := range on {
			dest = append(dest, &on[i])
		}
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("compare %s: %w", t.Name, err)
		}
		key := strings.Join(keys, "/")
		// History older than the log: nothing to recompute it from.
		if t.MadeByLog && inLive && created != nil && !horizon.IsZero() && created.Before(horizon) {
			rep.Unverifiable++
			continue
		}
		// Groups whose last writer is not in the log; a row that only such writers made is
		// unverifiable, not missing.
		unknown := map[string]bool{}
		known := false
		for i, w := range writers {
			switch {
			case ws[i] == nil || *ws[i] == "":
			case seen[*ws[i]]:
				known = true
			default:
				unknown[w] = true
			}
		}
		allUnknown := len(unknown) > 0 && !known
		if !inLive || !inLog {
			if inLive && allUnknown {
				rep.Unverifiable++
				continue
			}
			d := Difference{Table: t.Name, Key: key}
			if inLive {
				d.Live = ptr("row")
			}
			rep.Differences = append(rep.Differences, d)
			fmt.Fprintln(out, d.Line())
			continue
		}
		rep.Unverifiable += len(unknown)
		fi := 0
		for _, g := range t.Groups {
			for _, f := range g.Fields {
				l, r := vals[2*fi], vals[2*fi+1]
				fi++
				if g.Writer != "" && unknown[g.Writer] {
					continue
				}
				if g.When != "" && !on[slices.Index(whens, g.When)] {
					continue
				}
				if (l == nil) != (r == nil) || (l != nil && *l != *r) {
					d := Difference{Table: t.Name, Key: key, Field: f, Live: l, Log: r, History: g.History}
					if g.History && !strict {
						rep.History = append(rep.History, d)
					} else {
						rep.Differences = append(rep.Differences, d)
					}
					fmt.Fprintln(out, d.Line())
				}
			}
		}
	}
	return rows.Err()
}
