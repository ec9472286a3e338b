package webhooks

import (
	"errors"

	"billing/internal/jobs"
)

// JobKindProcessEvent is River's kind of the job that processes one stored event. River finds
// the worker by it, and the store and the sweeper find the jobs by it in SQL, so it is written
// in one place only.
const JobKindProcessEvent = "webhook_event"

// processJobInsert returns an INSERT of the processing job of args into river_job, and its
// arguments, which are numbered from $first (jobs.RowInsert, River's row). The statement ends with
// its SELECT list: the store appends a FROM clause, to insert the job only if it inserted the
// event, so that the event and its job are stored in one statement (one round trip on the receive
// path). A unique job would need RowConflict after that clause: it is refused.
func processJobInsert(args ProcessEventArgs, first int) (string, []any, error) {
	opts := args.InsertOpts()
	if opts.UniqueOpts.ByArgs {
		return "", nil, errors.New("process job: UniqueOpts is not written by processJobInsert")
	}
	return jobs.RowInsert(args, opts, first)
}
