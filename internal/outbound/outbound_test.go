package outbound

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/internal/apitest"
	"billing/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// now is the fixture's clock: rows are dated relative to it, so their age is exact.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// callRow is a row of the test's own table of outbound calls.
type callRow struct {
	ID             string
	IdempotencyKey string
	State          string
	ObjectID       *string
	Refusal        *string
	Attempts       int
	LastStep       *string
	CreatedAt      time.Time
}

// object stands for what Stripe makes.
type object struct{ ID string }

// fixture is one test's table and its "Stripe": plain callbacks that record what they were asked.
type fixture struct {
	t  *testing.T
	db *gorm.DB

	// What Stripe answers; set by each test.
	find   func() (object, bool, error)
	create func(p stripe.Params) (object, error)

	mu     sync.Mutex
	events []string
	keys   []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, db: testenv.DB(t)}
	f.exec(`CREATE TABLE calls (
		id text PRIMARY KEY,
		idempotency_key text NOT NULL UNIQUE,
		state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'completed')),
		object_id text,
		refusal text,
		attempts integer NOT NULL DEFAULT 0,
		last_step text,
		created_at timestamptz NOT NULL)`)
	f.find = func() (object, bool, error) { return object{}, false, nil }
	f.create = func(stripe.Params) (object, error) { return object{ID: "obj_1"}, nil }
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if err := f.db.Exec(sql, args...).Error; err != nil {
		f.t.Fatalf("exec %q: %v", sql, err)
	}
}

// insert commits a pending row created age before now; its key is not derived from its id, so
// that a key sent to Stripe can only have come from the row.
func (f *fixture) insert(id string, age time.Duration) {
	f.t.Helper()
	f.exec(`INSERT INTO calls (id, idempotency_key, created_at) VALUES ($1, $2, $3)`, id, "key-of-"+id, now.Add(-age))
}

func (f *fixture) row(id string) callRow {
	f.t.Helper()
	var row callRow
	if err := f.db.Raw(`SELECT * FROM calls WHERE id = $1`, id).Scan(&row).Error; err != nil {
		f.t.Fatalf("load row %s: %v", id, err)
	}
	return row
}

func (f *fixture) record(event string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, event)
}

// took returns and forgets the events so far.
func (f *fixture) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := f.events
	f.events = nil
	return ev
}

// call is the Call of row id, as a user of the protocol writes it.
func (f *fixture) call(id string) Call[object] {
	var row callRow
	return Call[object]{
		Lock: Select{SQL: `SELECT * FROM calls WHERE id = $1`, Args: []any{id}, Into: &row},
		Locked: func(*gorm.DB) (State, error) {
			return State{Key: row.IdempotencyKey, CreatedAt: row.CreatedAt, Done: row.State == "completed"}, nil
		},
		Find: func(ctx context.Context) (object, bool, error) {
			f.record("find")
			return f.find()
		},
		Create: func(p stripe.Params) (object, error) {
			f.record("create")
			f.mu.Lock()
			if p.IdempotencyKey != nil {
				f.keys = append(f.keys, *p.IdempotencyKey)
			} else {
				f.keys = append(f.keys, "")
			}
			f.mu.Unlock()
			if p.Context == nil {
				f.t.Errorf("create of %s without a context", id)
			}
			return f.create(p)
		},
		Complete: func(tx *gorm.DB, obj object, a Attempt) error {
			f.record("complete after " + a.Step.String())
			return tx.Exec(`UPDATE calls SET state = 'completed', object_id = $1, attempts = attempts + 1, last_step = $2
				WHERE id = $3`, obj.ID, a.Step.String(), id).Error
		},
		Refuse: func(tx *gorm.DB, a Attempt) error {
			f.record("refuse")
			return tx.Exec(`UPDATE calls SET state = 'completed', refusal = $1, attempts = attempts + 1, last_step = $2
				WHERE id = $3`, a.Err.Error(), a.Step.String(), id).Error
		},
		RecordAttempt: func(tx *gorm.DB, a Attempt) error {
			f.record("record attempt")
			return tx.Exec(`UPDATE calls SET attempts = attempts + 1, last_step = $1 WHERE id = $2`, a.Step.String(), id).Error
		},
		Now: func() time.Time { return now },
	}
}

func (f *fixture) run(c Call[object]) Result {
	f.t.Helper()
	res, err := Run(context.Background(), f.db, c)
	if err != nil {
		f.t.Fatalf("Run: %v", err)
	}
	return res
}

func expectEvents(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
}

func stripeErr(status int, typ stripe.ErrorType, code stripe.ErrorCode) *stripe.Error {
	return &stripe.Error{HTTPStatusCode: status, Type: typ, Code: code, Msg: fmt.Sprintf("%d %s", status, typ)}
}

// Rule 1: Stripe is called only for a row that is committed, pending, before the call.
func TestRunCallsOnlyForACommittedPendingRow(t *testing.T) {
	t.Parallel()

	t.Run("a transaction handle is refused", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		err := f.db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec(`INSERT INTO calls (id, idempotency_key, created_at) VALUES ('r1', 'key-of-r1', $1)`, now).Error; err != nil {
				return err
			}
			_, err := Run(context.Background(), tx, f.call("r1"))
			return err
		})
		if !errors.Is(err, ErrInTransaction) {
			t.Errorf("Run inside a transaction: %v, want ErrInTransaction", err)
		}
		expectEvents(t, f.took())
	})

	t.Run("a row another transaction has not committed is not there", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		other := f.db.Begin()
		t.Cleanup(func() { other.Rollback() })
		if err := other.Exec(`INSERT INTO calls (id, idempotency_key, created_at) VALUES ('r1', 'key-of-r1', $1)`, now).Error; err != nil {
			t.Fatal(err)
		}
		if res := f.run(f.call("r1")); res.Outcome != Gone {
			t.Errorf("outcome %v, want gone", res.Outcome)
		}
		expectEvents(t, f.took())
	})

	t.Run("the row others see during the call is pending", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.insert("r1", time.Minute)
		f.create = func(stripe.Params) (object, error) {
			// From another connection: what a crash at this moment would leave.
			if row := f.row("r1"); row.State != "pending" {
				t.Errorf("during the call the row is %+v, want pending", row)
			}
			return object{ID: "obj_1"}, nil
		}
		if res := f.run(f.call("r1")); res.Outcome != Completed {
			t.Errorf("outcome %v, want completed", res.Outcome)
		}
	})
}

// Rule 2: the row lock is held from before the call until its outcome is committed.
func TestRowLockIsHeldAcrossTheCall(t *testing.T) {
	t.Parallel()

	t.Run("locked during the call, completed when released", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.insert("r1", time.Minute)
		probe := func() error { return f.db.Exec(`SELECT id FROM calls WHERE id = 'r1' FOR UPDATE NOWAIT`).Error }
		f.create = func(stripe.Params) (object, error) {
			var pgErr *pgconn.PgError
			if err := probe(); !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
				t.Errorf("during the call the row could be locked by another: %v", err)
			}
			return object{ID: "obj_1"}, nil
		}
		f.run(f.call("r1"))
		if err := probe(); err != nil {
			t.Errorf("after Run the row is still locked: %v", err)
		}
		if row := f.row("r1"); row.State != "completed" || row.ObjectID == nil || *row.ObjectID != "obj_1" {
			t.Errorf("row %+v", row)
		}
	})

	t.Run("concurrent runs make one call", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.insert("r1", time.Minute)
		const n = 6
		f.create = func(stripe.Params) (object, error) {
			// Answer only once every other run waits on the lock.
			apitest.WaitForLockWaiters(t, f.db, n-1)
			return object{ID: "obj_1"}, nil
		}
		results := make([]Result, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { results[i], errs[i] = Run(context.Background(), f.db, f.call("r1")) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		count := map[Outcome]int{}
		for _, r := range results {
			count[r.Outcome]++
		}
		if count[Completed] != 1 || count[AlreadyDone] != n-1 {
			t.Errorf("outcomes %v, want 1 completed and %d already done", count, n-1)
		}
		expectEvents(t, f.took(), "create", "complete after create")
	})
}

// Rule 3: every attempt sends the row's key, inside and past the key window.
func TestEveryAttemptUsesTheRowsKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.insert("r1", time.Hour)
	answers := []error{
		stripeErr(500, stripe.ErrorTypeAPI, ""),
		errors.New("read tcp: connection reset by peer"),
		nil,
	}
	f.create = func(stripe.Params) (object, error) {
		err := answers[0]
		answers = answers[1:]
		return object{ID: "obj_1"}, err
	}
	for i, want := range []Outcome{Pending, Pending} {
		if res := f.run(f.call("r1")); res.Outcome != want {
			t.Fatalf("attempt %d: %v, want %v", i+1, res.Outcome, want)
		}
	}
	// The third attempt comes after Stripe may have forgotten the key: found nothing, it
	// creates under the same key all the same.
	f.exec(`UPDATE calls SET created_at = $1`, now.Add(-2*KeyWindow))
	if res := f.run(f.call("r1")); res.Outcome != Completed {
		t.Fatalf("third attempt: %v", res.Outcome)
	}
	if want := []string{"key-of-r1", "key-of-r1", "key-of-r1"}; !slices.Equal(f.keys, want) {
		t.Errorf("keys sent %q, want %q", f.keys, want)
	}
	if row := f.row("r1"); row.Attempts != 3 || row.State != "completed" {
		t.Errorf("row %+v, want completed after 3 attempts", row)
	}
}

// Rule 4: past KeyWindow, Stripe is searched before anything is created.
func TestPastTheKeyWindowFindComesBeforeCreate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		age         time.Duration
		find        func() (object, bool, error)
		outcome     Outcome
		events      []string
		wantObject  string
		wantPending bool
	}{
		{
			name: "inside the window: create only", age: KeyWindow - time.Microsecond, // the column keeps microseconds
			outcome: Completed, events: []string{"create", "complete after create"}, wantObject: "obj_new",
		},
		{
			name: "at the window, nothing found: find, then create", age: KeyWindow,
			outcome: Completed, events: []string{"find", "create", "complete after create"}, wantObject: "obj_new",
		},
		{
			name: "found: completed with it, nothing created", age: 3 * KeyWindow,
			find:    func() (object, bool, error) { return object{ID: "obj_old"}, true, nil },
			outcome: Completed, events: []string{"find", "complete after find"}, wantObject: "obj_old",
		},
		{
			name: "lookup refused: pending, nothing created", age: KeyWindow,
			find: func() (object, bool, error) {
				return object{}, false, stripeErr(400, stripe.ErrorTypeInvalidRequest, "")
			},
			outcome: Pending, events: []string{"find", "record attempt"}, wantPending: true,
		},
		{
			name: "lookup unanswered: pending, nothing created", age: KeyWindow,
			find:    func() (object, bool, error) { return object{}, false, errors.New("dial tcp: connection refused") },
			outcome: Pending, events: []string{"find", "record attempt"}, wantPending: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.insert("r1", tc.age)
			if tc.find != nil {
				f.find = tc.find
			}
			f.create = func(stripe.Params) (object, error) { return object{ID: "obj_new"}, nil }
			res := f.run(f.call("r1"))
			if res.Outcome != tc.outcome {
				t.Errorf("outcome %v, want %v", res.Outcome, tc.outcome)
			}
			expectEvents(t, f.took(), tc.events...)
			row := f.row("r1")
			if tc.wantPending {
				if row.State != "pending" || row.Attempts != 1 || row.LastStep == nil || *row.LastStep != "find" ||
					res.Attempt.Step != StepFind || res.Attempt.Err == nil {
					t.Errorf("row %+v, attempt %+v; want pending after a failed find", row, res.Attempt)
				}
				return
			}
			if row.State != "completed" || row.ObjectID == nil || *row.ObjectID != tc.wantObject {
				t.Errorf("row %+v, want completed with %s", row, tc.wantObject)
			}
		})
	}
}

// Rule 5: a final refusal completes the row; any other failure leaves it pending, attempt recorded.
func TestFinalRefusalCompletesOtherFailuresStayPending(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		err   error
		final bool
	}{
		{"invalid request", stripeErr(400, stripe.ErrorTypeInvalidRequest, "parameter_invalid_integer"), true},
		{"card declined", stripeErr(402, stripe.ErrorTypeCard, stripe.ErrorCodeCardDeclined), true},
		{"no such object", stripeErr(404, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeResourceMissing), true},
		{"wrapped refusal", fmt.Errorf("create: %w", stripeErr(400, stripe.ErrorTypeInvalidRequest, "")), true},
		{"server error", stripeErr(500, stripe.ErrorTypeAPI, ""), false},
		{"rate limited", stripeErr(429, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeRateLimit), false},
		{"key in use by a concurrent request", stripeErr(409, stripe.ErrorTypeInvalidRequest, ""), false},
		{"no status", stripeErr(0, "", ""), false},
		{"no answer", errors.New("read tcp: connection reset by peer"), false},
		{"key reused with other parameters", stripeErr(400, stripe.ErrorTypeIdempotency, ""), false},
		{"bad API key", stripeErr(401, stripe.ErrorTypeInvalidRequest, ""), false},
		{"restricted API key", stripeErr(403, stripe.ErrorTypeInvalidRequest, ""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.insert("r1", time.Minute)
			f.create = func(stripe.Params) (object, error) { return object{}, tc.err }
			res := f.run(f.call("r1"))
			if !errors.Is(res.Attempt.Err, tc.err) || res.Attempt.Step != StepCreate {
				t.Errorf("attempt %+v, want the create's error", res.Attempt)
			}
			row := f.row("r1")
			if tc.final {
				if res.Outcome != Refused || row.State != "completed" || row.Refusal == nil || row.Attempts != 1 {
					t.Errorf("outcome %v, row %+v; want refused and completed", res.Outcome, row)
				}
				expectEvents(t, f.took(), "create", "refuse")
				return
			}
			if res.Outcome != Pending || row.State != "pending" || row.Refusal != nil || row.Attempts != 1 {
				t.Errorf("outcome %v, row %+v; want pending after 1 recorded attempt", res.Outcome, row)
			}
			expectEvents(t, f.took(), "create", "record attempt")
		})
	}
}

func TestNothingIsCalledForAFinishedMissingOrRefusedRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.insert("done", time.Minute)
	f.exec(`UPDATE calls SET state = 'completed', object_id = 'obj_1' WHERE id = 'done'`)
	if res := f.run(f.call("done")); res.Outcome != AlreadyDone {
		t.Errorf("completed row: %v, want already done", res.Outcome)
	}
	if res := f.run(f.call("nobody")); res.Outcome != Gone {
		t.Errorf("missing row: %v, want gone", res.Outcome)
	}
	f.insert("other", time.Minute)
	refusal := errors.New("the row belongs to the other mode")
	c := f.call("other")
	c.Locked = func(*gorm.DB) (State, error) { return State{}, refusal }
	if _, err := Run(context.Background(), f.db, c); !errors.Is(err, refusal) {
		t.Errorf("Locked's refusal: Run returned %v", err)
	}
	expectEvents(t, f.took())
	if row := f.row("other"); row.State != "pending" || row.Attempts != 0 {
		t.Errorf("refused row touched: %+v", row)
	}
}

// A failure to record Stripe's answer rolls the attempt back: the row stays pending and the
// next attempt repeats the call under the same key (Stripe answers it from its key).
func TestFailedRecordingLeavesTheRowPending(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.insert("r1", time.Minute)
	broken := f.call("r1")
	complete := broken.Complete
	broken.Complete = func(tx *gorm.DB, obj object, a Attempt) error {
		if err := complete(tx, obj, a); err != nil {
			return err
		}
		return errors.New("commit lost")
	}
	if _, err := Run(context.Background(), f.db, broken); err == nil || !strings.Contains(err.Error(), "commit lost") {
		t.Fatalf("Run returned %v", err)
	}
	if row := f.row("r1"); row.State != "pending" || row.Attempts != 0 {
		t.Fatalf("row %+v, want pending as before", row)
	}
	if res := f.run(f.call("r1")); res.Outcome != Completed {
		t.Errorf("retry: %v", res.Outcome)
	}
	if want := []string{"key-of-r1", "key-of-r1"}; !slices.Equal(f.keys, want) {
		t.Errorf("keys %q, want %q", f.keys, want)
	}
}

func TestIncompleteCallIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.insert("r1", time.Minute)
	c := f.call("r1")
	c.Find, c.RecordAttempt = nil, nil
	_, err := Run(context.Background(), f.db, c)
	if err == nil || !strings.Contains(err.Error(), "Find or Review, RecordAttempt") {
		t.Errorf("Run of a Call without Find and RecordAttempt: %v", err)
	}
	expectEvents(t, f.took())
}

// An object without a lookup (Review instead of Find): inside its window the row is created
// under its key; past it, nothing is called and Review records it for an operator.
func TestWithoutLookupPastTheWindowGoesToReview(t *testing.T) {
	t.Parallel()
	const window = 20 * time.Hour
	for _, tc := range []struct {
		name    string
		age     time.Duration
		outcome Outcome
		events  []string
	}{
		{"inside the window: created", window - time.Microsecond, Completed, []string{"create", "complete after create"}},
		{"at the window: review, nothing sent", window, Review, []string{"review"}},
		{"long past it: review, nothing sent", 10 * window, Review, []string{"review"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.insert("r1", tc.age)
			c := f.call("r1")
			c.Find, c.Window = nil, window
			c.Review = func(tx *gorm.DB, a Attempt) error {
				f.record("review")
				if a.Step != 0 || a.Err != nil || !a.At.Equal(now) {
					t.Errorf("review attempt %+v, want one at now without a step", a)
				}
				return tx.Exec(`UPDATE calls SET last_step = 'review' WHERE id = 'r1'`).Error
			}
			res := f.run(c)
			if res.Outcome != tc.outcome {
				t.Errorf("outcome %v, want %v", res.Outcome, tc.outcome)
			}
			expectEvents(t, f.took(), tc.events...)
			if row := f.row("r1"); tc.outcome == Review && (row.State != "pending" || row.LastStep == nil || *row.LastStep != "review") {
				t.Errorf("row %+v, want pending and marked by Review", row)
			}
		})
	}
	f := newFixture(t)
	f.insert("r1", time.Minute)
	c := f.call("r1")
	c.Review = func(*gorm.DB, Attempt) error { return nil }
	if _, err := Run(context.Background(), f.db, c); err == nil || !strings.Contains(err.Error(), "both Find and Review") {
		t.Errorf("Run of a Call with Find and Review: %v", err)
	}
	expectEvents(t, f.took())
}

// SkipLocked: a row held by a concurrent attempt is Busy, with nothing called; a missing row
// is still Gone, and a free one is finished.
func TestSkipLockedRowIsBusy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.insert("r1", time.Minute)
	tx := f.db.Begin()
	defer tx.Rollback()
	if err := tx.Exec(`SELECT * FROM calls WHERE id = 'r1' FOR UPDATE`).Error; err != nil {
		t.Fatal(err)
	}
	c := f.call("r1")
	c.Lock.SkipLocked = true
	if res := f.run(c); res.Outcome != Busy {
		t.Errorf("held row: %v, want busy", res.Outcome)
	}
	expectEvents(t, f.took())
	missing := f.call("nobody")
	missing.Lock.SkipLocked = true
	if res := f.run(missing); res.Outcome != Gone {
		t.Errorf("missing row: %v, want gone", res.Outcome)
	}
	tx.Rollback()
	c = f.call("r1")
	c.Lock.SkipLocked = true
	if res := f.run(c); res.Outcome != Completed {
		t.Errorf("released row: %v, want completed", res.Outcome)
	}
	expectEvents(t, f.took(), "create", "complete after create")
}

func TestKey(t *testing.T) {
	t.Parallel()
	for got, want := range map[string]string{
		Key("customer", "u1"):            "customer-u1",
		Key("charge", "o1"):              "charge-o1",
		Key("refund", "o1", "r1"):        "refund-o1-r1",
		Key("checkout", "u1", "req_2-b"): "checkout-u1-req_2-b",
	} {
		if got != want {
			t.Errorf("Key = %q, want %q", got, want)
		}
	}
}
