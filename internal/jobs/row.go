package jobs

import (
	"cmp"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/riverqueue/river"
)

// RowInsert returns an INSERT of the row River's InsertTx writes for args with opts into
// river_job, and its arguments, numbered from $first. It is the one place that writes River's
// table without River: the receive path stores an event and its job in one statement, and the
// jobs the handlers queue cost a fraction of River's path (its database/sql driver encodes every
// column as an array). The row must be River's, column by column, so that River's workers,
// rescuer, scheduler and cleaner treat it as one of theirs; tests compare the two for every
// kind written here.
//
// The statement ends with its SELECT list: the caller may append a FROM clause (the store
// inserts the job only if it inserted the event). A job unique by its args (UniqueOpts{ByArgs:
// true}) carries River's unique key and states, and the statement must end with RowConflict so
// that a duplicate is skipped as River skips it. Options this INSERT would not write as River
// does (the pending state, uniqueness other than by args in the default states) are refused
// rather than ignored. A ScheduledAt makes the job scheduled, as River does; none, available now.
func RowInsert(args river.JobArgs, opts river.InsertOpts, first int) (string, []any, error) {
	return rowInsert(args, opts, first, "")
}

// rowInsert is RowInsert, with merge (when set) a jsonb expression merged into the args column.
func rowInsert(args river.JobArgs, opts river.InsertOpts, first int, merge string) (string, []any, error) {
	u := opts.UniqueOpts
	byArgs := u.ByArgs
	u.ByArgs = false
	if opts.Pending || !reflect.ValueOf(u).IsZero() {
		return "", nil, fmt.Errorf("job %s: pending, or unique otherwise than by args, is not written by RowInsert", args.Kind())
	}
	encoded, err := json.Marshal(args)
	if err != nil {
		return "", nil, fmt.Errorf("encode job %s: %w", args.Kind(), err)
	}
	metadata := string(opts.Metadata)
	if metadata == "" {
		metadata = "{}"
	}
	state, at := "available", any(nil)
	if !opts.ScheduledAt.IsZero() {
		state, at = "scheduled", opts.ScheduledAt
	}
	var key []byte
	var states any
	if byArgs {
		if key, err = uniqueKey(args, encoded); err != nil {
			return "", nil, err
		}
		states = int(defaultUniqueStates)
	}
	p := func(k int) string { return "$" + strconv.Itoa(first+k) }
	argsColumn := `CAST(` + p(0) + ` AS jsonb)`
	if merge != "" {
		argsColumn += ` || ` + merge
	}
	sql := `INSERT INTO river_job (args, kind, max_attempts, metadata, priority, queue, state, tags, scheduled_at, unique_key, unique_states)
		  SELECT ` + argsColumn + `, CAST(` + p(1) + ` AS text), CAST(` + p(2) + ` AS smallint), CAST(` + p(3) + ` AS jsonb),
		    CAST(` + p(4) + ` AS smallint), CAST(` + p(5) + ` AS text), CAST(` + p(6) + ` AS river_job_state),
		    CAST(string_to_array(CAST(` + p(7) + ` AS text), ',') AS varchar(255)[]), coalesce(CAST(` + p(8) + ` AS timestamptz), now()),
		    CAST(` + p(9) + ` AS bytea), CAST(CAST(` + p(10) + ` AS integer) AS bit(8))`
	// River's defaults for what InsertOpts leaves unset; its MaxAttempts default is the client's,
	// which we never change.
	return sql, []any{string(encoded), args.Kind(), cmp.Or(opts.MaxAttempts, river.MaxAttemptsDefault), metadata,
		cmp.Or(opts.Priority, river.PriorityDefault), cmp.Or(opts.Queue, river.QueueDefault), state, strings.Join(opts.Tags, ","),
		at, key, states}, nil
}

// RowConflict ends a RowInsert of a unique job: a live duplicate (River's unique index) is skipped.
const RowConflict = `
		ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND unique_states IS NOT NULL
		  AND river_job_state_in_bitmask(unique_states, state)
		DO NOTHING`
