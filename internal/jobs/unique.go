package jobs

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivershared/uniquestates"
	"github.com/riverqueue/river/rivertype"
)

// InsertUniqueTx inserts in tx a job unique by the `river:"unique"` fields of its args, as
// River's InsertTx does with UniqueOpts{ByArgs: true} — scheduled at scheduledAt, or available
// now when it is zero — in one statement of our own. River's path cost a quarter of an applied
// event's CPU (its database/sql driver encodes every column as an array); this one binds plain
// values. The row is the one River writes — the same unique key and states, so River's own
// inserts and this one skip each other's duplicates — which TestInsertUniqueTxWritesRiversRow
// checks column by column. No notification is sent: the client polls (PollOnly). skipped
// reports a duplicate. ins is the caller's Inserter: Discard (a replay whose jobs must not
// exist) gets nothing written here either.
//
// Only what the callers need is supported: a flat args struct whose unique fields have plain
// JSON names, a ScheduledAt or none, a MaxAttempts (River's default when zero), no tags,
// metadata, priority or queue of its own.
func InsertUniqueTx(ctx context.Context, ins Inserter, tx *sql.Tx, args river.JobArgs, scheduledAt time.Time, maxAttempts int) (skipped bool, err error) {
	if _, discard := ins.(Discard); discard {
		return false, nil
	}
	// River writes a job given a ScheduledAt as scheduled (its scheduler makes it available once
	// due), and one without as available at the database's now().
	state, at := "scheduled", any(scheduledAt)
	if scheduledAt.IsZero() {
		state, at = "available", nil
	}
	encoded, err := json.Marshal(args)
	if err != nil {
		return false, fmt.Errorf("encode job %s: %w", args.Kind(), err)
	}
	key, err := uniqueKey(args, encoded)
	if err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, `
		INSERT INTO river_job (args, kind, max_attempts, metadata, priority, queue, scheduled_at, state, tags, unique_key, unique_states)
		VALUES (CAST($1 AS jsonb), $2, $3, CAST('{}' AS jsonb), $4, $5, coalesce(CAST($6 AS timestamptz), now()),
		        CAST($9 AS river_job_state), CAST('{}' AS varchar(255)[]), $7, CAST(CAST($8 AS integer) AS bit(8)))
		ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND unique_states IS NOT NULL
		  AND river_job_state_in_bitmask(unique_states, state)
		DO NOTHING`,
		string(encoded), args.Kind(), cmp.Or(maxAttempts, river.MaxAttemptsDefault), river.PriorityDefault, river.QueueDefault,
		at, key, int(defaultUniqueStates), state)
	if err != nil {
		return false, fmt.Errorf("insert job %s: %w", args.Kind(), err)
	}
	n, err := res.RowsAffected()
	return n == 0, err
}

// defaultUniqueStates is River's bitmask of the states in which a unique job blocks another.
var defaultUniqueStates = uniquestates.UniqueStatesToBitmask(rivertype.UniqueOptsByStateDefault())

// uniqueKey is River's unique key of a job unique by args: the SHA-256 of
// "&kind=K&args={…}", the object holding the encoded values of the unique fields that are
// present, in the order of their JSON names.
func uniqueKey(args river.JobArgs, encoded []byte) ([]byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(encoded, &members); err != nil {
		return nil, fmt.Errorf("job %s: %w", args.Kind(), err)
	}
	names, err := uniqueFields(reflect.TypeOf(args))
	if err != nil {
		return nil, err
	}
	var sb strings.Builder
	sb.WriteString("&kind=" + args.Kind() + "&args={")
	first := true
	for _, name := range names {
		v, ok := members[name]
		if !ok {
			continue // omitted (omitempty): River leaves it out too
		}
		if !first {
			sb.WriteByte(',')
		}
		first = false
		sb.WriteString(`"` + name + `":`)
		sb.Write(v)
	}
	sb.WriteByte('}')
	sum := sha256.Sum256([]byte(sb.String()))
	return sum[:], nil
}

// uniqueFields are the JSON names of a flat struct's fields tagged river:"unique", sorted.
func uniqueFields(t reflect.Type) ([]string, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("jobs: unique args of kind %s, not a struct", t.Kind())
	}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !slices.Contains(strings.Split(f.Tag.Get("river"), ","), "unique") {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" || strings.ContainsAny(name, `."\*?`) || f.Type.Kind() == reflect.Struct {
			return nil, fmt.Errorf("jobs: unique field %s of %s needs a plain JSON name and value", f.Name, t)
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("jobs: %s has no river:\"unique\" field", t)
	}
	slices.Sort(names)
	return names, nil
}
