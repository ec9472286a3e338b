package webhooks

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/riverqueue/river"
)

// JobKindProcessEvent is River's kind of the job that processes one stored event. River finds
// the worker by it, and the store and the sweeper find the jobs by it in SQL, so it is written
// in one place only.
const JobKindProcessEvent = "webhook_event"

// processJobInsert returns an INSERT of the processing job of args into river_job, and its
// arguments, which are numbered from $first. The statement ends with its SELECT list: the caller
// may append a FROM clause (the store inserts the job only if it inserted the event).
//
// This is the only place that writes River's table without River, so that the event and its job
// are stored in one statement (one round trip on the receive path). The row must be the one
// River's InsertTx writes for the same args, with the kind and options of ProcessEventArgs: then
// River's workers, rescuer and cleaner handle it like any of theirs. Options River would turn into
// something this INSERT does not write (a schedule, the pending state, uniqueness) are refused
// rather than ignored.
func processJobInsert(args ProcessEventArgs, first int) (string, []any, error) {
	opts := args.InsertOpts()
	switch {
	case !opts.ScheduledAt.IsZero(), opts.Pending, !reflect.ValueOf(opts.UniqueOpts).IsZero():
		return "", nil, errors.New("process job: ScheduledAt, Pending and UniqueOpts are not written by processJobInsert")
	}
	encoded, err := json.Marshal(args)
	if err != nil {
		return "", nil, fmt.Errorf("encode job of event %s: %w", args.EventID, err)
	}
	metadata := string(opts.Metadata)
	if metadata == "" {
		metadata = "{}"
	}
	// River's defaults for what InsertOpts leaves unset; its MaxAttempts default is the
	// client's, which we never change.
	maxAttempts := cmp.Or(opts.MaxAttempts, river.MaxAttemptsDefault)
	priority := cmp.Or(opts.Priority, river.PriorityDefault)
	queue := cmp.Or(opts.Queue, river.QueueDefault)
	p := func(k int) string { return "$" + strconv.Itoa(first+k) }
	sql := `INSERT INTO river_job (args, kind, max_attempts, metadata, priority, queue, state, tags, scheduled_at)
		  SELECT CAST(` + p(0) + ` AS jsonb), CAST(` + p(1) + ` AS text), CAST(` + p(2) + ` AS smallint), CAST(` + p(3) + ` AS jsonb),
		    CAST(` + p(4) + ` AS smallint), CAST(` + p(5) + ` AS text), 'available', CAST(string_to_array(CAST(` + p(6) + ` AS text), ',') AS varchar(255)[]), now()`
	return sql, []any{string(encoded), args.Kind(), maxAttempts, metadata, priority, queue, strings.Join(opts.Tags, ",")}, nil
}
