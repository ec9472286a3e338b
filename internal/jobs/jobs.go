// Package jobs holds the small glue between gorm transactions and River: the *sql.Tx inside a
// gorm transaction, and the interface of "insert a job in this transaction".
package jobs

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/rivertype"
	"gorm.io/gorm"
)

// Inserter enqueues jobs inside the caller's transaction: a job exists iff the transaction that
// asked for it committed. *river.Client[*sql.Tx] implements it.
type Inserter interface {
	InsertTx(ctx context.Context, tx *sql.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// SQLTx returns the *sql.Tx under a gorm transaction, for River's InsertTx.
func SQLTx(tx *gorm.DB) (*sql.Tx, error) {
	switch p := tx.Statement.ConnPool.(type) {
	case *sql.Tx:
		return p, nil
	case *gorm.PreparedStmtTX:
		if sqlTx, ok := p.Tx.(*sql.Tx); ok {
			return sqlTx, nil
		}
	}
	return nil, fmt.Errorf("jobs: gorm handle is not in a database/sql transaction (%T)", tx.Statement.ConnPool)
}

// ClientOptions are what differs between the service's River client and the tests' ones.
type ClientOptions struct {
	Workers *river.Workers
	// Queues and their worker counts.
	Queues map[string]int
	// PollInterval is how long an idle queue waits before looking for new jobs; 50ms if zero.
	PollInterval time.Duration
	// RescueAfter is how long a job may stay running (its process died) before it runs again;
	// a minute if zero. It also bounds a job's run time.
	RescueAfter  time.Duration
	PeriodicJobs []*river.PeriodicJob
	Logger       *slog.Logger
	// TestOnly skips River's production checks (tests run many clients on one schema).
	TestOnly bool
}

// NewClient is the one place that configures River for this service, so that the service and
// its tests poll, time out and rescue jobs the same way.
func NewClient(db *sql.DB, o ClientOptions) (*river.Client[*sql.Tx], error) {
	poll := o.PollInterval
	if poll <= 0 {
		poll = 50 * time.Millisecond
	}
	rescue := o.RescueAfter
	if rescue <= 0 {
		rescue = time.Minute
	}
	queues := make(map[string]river.QueueConfig, len(o.Queues))
	for name, n := range o.Queues {
		queues[name] = river.QueueConfig{MaxWorkers: n}
	}
	c, err := river.NewClient(riverdatabasesql.New(db), &river.Config{
		Queues:  queues,
		Workers: o.Workers,
		// database/sql has no LISTEN: workers poll. FetchCooldown bounds how often a busy queue
		// fetches; FetchPollInterval how long an idle one waits for new work.
		PollOnly:          true,
		FetchCooldown:     min(10*time.Millisecond, poll),
		FetchPollInterval: poll,
		// River requires the rescue delay to be at least the job timeout.
		JobTimeout:           min(30*time.Second, rescue),
		RescueStuckJobsAfter: rescue,
		PeriodicJobs:         o.PeriodicJobs,
		Logger:               o.Logger,
		TestOnly:             o.TestOnly,
	})
	if err != nil {
		return nil, fmt.Errorf("create river client: %w", err)
	}
	return c, nil
}

// Discard is an Inserter that inserts nothing: for handlers replayed where no job may follow
// (`billing verify` replays the log in a transaction that is rolled back).
type Discard struct{}

func (Discard) InsertTx(context.Context, *sql.Tx, river.JobArgs, *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	return &rivertype.JobInsertResult{Job: &rivertype.JobRow{}}, nil
}
