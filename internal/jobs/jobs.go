// Package jobs holds the small glue between gorm transactions and River: the *sql.Tx inside a
// gorm transaction, and the interface of "insert a job in this transaction".
package jobs

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"gorm.io/gorm"
)

// Inserter enqueues jobs inside the caller's transaction: a job exists iff the transaction that
// asked for it committed. *river.Client[*sql.Tx] implements it.
type Inserter interface {
	InsertTx(ctx context.Context, tx *sql.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// SQLTx returns the *sql.Tx under a gorm transaction, for River's InsertTx and JobCompleteTx.
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
