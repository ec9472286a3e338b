package jobs

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivershared/uniquestates"
	"github.com/riverqueue/river/rivertype"
)

// Within places a job's INSERT inside a statement of the caller's (a data-modifying CTE: one
// round trip instead of two).
type Within struct {
	// From: the job is inserted once for each of its rows ("" for once).
	From string
	// Args, when set, is a jsonb expression over From's columns merged into the job's args: a
	// value only the statement knows, such as the id of a row it inserts. It must name no unique
	// field, since the unique key is computed from the args as given.
	Args string
}

// UniqueInsert is the INSERT of a job unique by the `river:"unique"` fields of its args, as
// River's InsertTx writes it with UniqueOpts{ByArgs: true} — scheduled at scheduledAt, or
// available now when it is zero — placed within a statement of the caller's, its arguments
// numbered from $first (RowInsert's statement and RowConflict). River's own inserts and this one
// skip each other's duplicates (the same unique key and states), which
// TestUniqueInsertWritesRiversRow checks. No notification is sent: the client polls (PollOnly).
// ins is the caller's Inserter: for Discard (a replay whose jobs must not exist) the statement
// is "".
//
// Only what the callers need is supported: a flat args struct whose unique fields have plain
// JSON names, a ScheduledAt or none, a MaxAttempts (River's default when zero).
func UniqueInsert(ins Inserter, args river.JobArgs, scheduledAt time.Time, maxAttempts, first int, in Within) (string, []any, error) {
	if _, discard := ins.(Discard); discard {
		return "", nil, nil
	}
	query, params, err := rowInsert(args, river.InsertOpts{MaxAttempts: maxAttempts, ScheduledAt: scheduledAt,
		UniqueOpts: river.UniqueOpts{ByArgs: true}}, first, in.Args)
	if err != nil {
		return "", nil, err
	}
	if in.From != "" {
		query += " FROM " + in.From
	}
	return query + RowConflict, params, nil
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
	names, err := uniqueFieldsOf(reflect.TypeOf(args))
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

// uniqueNames caches uniqueFields by type: a job's fields do not change, and reading their tags
// was a third of the unique key's cost.
var uniqueNames sync.Map // reflect.Type → []string

// uniqueFieldsOf is uniqueFields, cached.
func uniqueFieldsOf(t reflect.Type) ([]string, error) {
	if names, ok := uniqueNames.Load(t); ok {
		return names.([]string), nil
	}
	names, err := uniqueFields(t)
	if err != nil {
		return nil, err
	}
	uniqueNames.Store(t, names)
	return names, nil
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
