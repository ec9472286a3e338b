package billing

// Fuzz targets of event decoding and handling. Their seed corpora run as ordinary tests in
// `make test`; `make fuzz` runs each for FUZZTIME:
//
//	go test -run '^$' -fuzz '^FuzzDecodeObject$' ./billing/
//	go test -run '^$' -fuzz '^FuzzHandleEvent$' ./billing/

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"gorm.io/gorm"

	"billing/internal/testenv"
	"billing/webhooks"
)

// fuzzTypes are the handled types; a fuzz input picks one by index.
var fuzzTypes = []string{
	EventSubscriptionCreated, EventSubscriptionUpdated, EventSubscriptionDeleted,
	EventSubscriptionTrialWillEnd, EventInvoicePaymentFailed, EventInvoicePaymentSucceeded,
}

func isInvoiceType(typ string) bool {
	return typ == EventInvoicePaymentFailed || typ == EventInvoicePaymentSucceeded
}

// fuzzSeed is one seed: a type index, a data.object and the event's created (unix seconds).
type fuzzSeed struct {
	typ     uint8
	object  []byte
	created int64
}

// fuzzSeeds are the real fixtures of the repository's testdata/stripe-events (the handled
// types), objects built like the lifecycle tests build them, against the rows FuzzHandleEvent
// commits first, and malformed and edge-case objects.
func fuzzSeeds(f *testing.F) []fuzzSeed {
	f.Helper()
	var out []fuzzSeed
	paths, err := filepath.Glob(filepath.Join("..", "testdata", "stripe-events", "*.json"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no fixtures: %v", err)
	}
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		var ev struct {
			Type    string `json:"type"`
			Created int64  `json:"created"`
			Data    struct {
				Object json.RawMessage `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal(raw, &ev); err != nil {
			f.Fatalf("%s: %v", p, err)
		}
		if i := slices.Index(fuzzTypes, ev.Type); i >= 0 {
			out = append(out, fuzzSeed{uint8(i), ev.Data.Object, ev.Created})
		}
	}
	sub := subObj{ID: "sub_fuzz_1", Customer: "cus_fuzz_1", Status: StatusActive, Price: "price_1", PeriodStart: 10, PeriodEnd: 100}
	inv := invObj{ID: "in_fuzz_1", Customer: "cus_fuzz_1", Subscription: "sub_fuzz_1", Currency: "usd", AmountDue: 2000, AttemptCount: 1, NextAttempt: 50, Email: "a@example.com"}
	for i := range fuzzTypes {
		ti := uint8(i)
		if isInvoiceType(fuzzTypes[i]) {
			out = append(out,
				fuzzSeed{ti, inv.JSON(), base + 20},
				fuzzSeed{ti, invObj{ID: "in_2", Customer: "cus_other", Subscription: "sub_fuzz_1"}.JSON(), base + 20},
				fuzzSeed{ti, invObj{ID: "in_3", Customer: "cus_fuzz_2", Subscription: "sub_fuzz_2"}.JSON(), base + 20},
				fuzzSeed{ti, invObj{ID: "in_4", Customer: "cus_fuzz_1"}.JSON(), base + 20},
				fuzzSeed{ti, []byte(`{"id":"in_5","customer":"cus_fuzz_1","subscription":null,"parent":{"subscription_details":{"subscription":"sub_fuzz_1"}}}`), base + 20},
				fuzzSeed{ti, []byte(`{"id":"in_6","customer":{"id":"cus_fuzz_1"},"subscription":{"id":"sub_fuzz_1"},"attempt_count":3000000000}`), base + 20},
				fuzzSeed{ti, []byte(`{"id":"in_7","customer":"cus_fuzz_1","subscription":"sub_fuzz_1","next_payment_attempt":1e15}`), base + 20},
				fuzzSeed{ti, []byte(`{"id":"in_8","customer":"cus_fuzz_1","subscription":"sub_fuzz_1","amount_due":-1,"attempt_count":-1,"next_payment_attempt":-1e11}`), base + 20},
				fuzzSeed{ti, []byte(`{"id":"in_9","customer":"cus_fuzz_1","subscription":"sub_fuzz_1","amount_due":1e19}`), base + 20},
			)
			continue
		}
		out = append(out,
			fuzzSeed{ti, sub.JSON(), base + 20},
			fuzzSeed{ti, sub.JSON(), base},
			fuzzSeed{ti, sub.With(StatusTrialing).JSON(), base + 20},
			fuzzSeed{ti, subObj{ID: "sub_fuzz_1", Customer: "cus_other", Status: StatusActive}.JSON(), base + 20},
			fuzzSeed{ti, subObj{ID: "sub_fuzz_2", Customer: "cus_fuzz_2", Status: StatusActive}.JSON(), base + 20},
			fuzzSeed{ti, subObj{ID: "sub_new", Customer: "cus_new", Status: "some_future_status"}.JSON(), 0},
			fuzzSeed{ti, []byte(`{"id":"sub_a","customer":{"id":"cus_a","object":"customer"},"status":"active","plan":{"id":"plan_1"},"items":{"data":[{"plan":"plan_2","current_period_end":"1717200000"}]}}`), base},
			fuzzSeed{ti, []byte(`{"id":"sub_b","customer":"cus_b","status":"active","current_period_end":1e15,"trial_end":-1e15}`), base},
			fuzzSeed{ti, []byte(`{"id":"sub_c","customer":"cus_c","status":"active","cancel_at":9223372036854775807,"ended_at":1.5}`), base},
			fuzzSeed{ti, []byte(`{"id":"sub_d","customer":"cus_d","status":"active","current_period_start":1e400}`), base},
			fuzzSeed{ti, []byte(`{"id":"sub_e","customer":"cus_e","status":"active","items":{"data":[]},"cancel_at_period_end":null}`), base},
			fuzzSeed{ti, []byte(`{"id":"sub_f","customer":"cus_f","status":"` + strings.Repeat("s", 300) + `"}`), 1 << 40},
		)
	}
	for _, malformed := range []string{
		`null`, `[]`, `"sub_1"`, `1`, `{}`, `{"id":1}`, `{"id":"x","customer":5,"status":"active"}`,
		`{"id":"sub_g","customer":"cus_g","status":"active","trial_end":{"x":1}}`,
		`{"id":"sub_g","customer":"cus_g","status":"active","trial_end":"soon"}`,
		`{"id":"sub_g","customer":"cus_g","status":"active","items":{"data":{}}}`,
		`{"id":"in_g","customer":"cus_g","subscription":["sub_g"]}`,
		`{"id":"x","customer":"c","status":"a","current_period_end":"NaN"}`,
		`{"id":"x","customer":"c","status":"a","current_period_end":"Inf"}`,
	} {
		out = append(out, fuzzSeed{0, []byte(malformed), base}, fuzzSeed{4, []byte(malformed), base})
	}
	// Event times far from now: the object is fine, the event's created is not plausible.
	for _, created := range []int64{-1, 1 << 33, 1 << 40, 1 << 62} {
		out = append(out, fuzzSeed{1, sub.JSON(), created}, fuzzSeed{4, inv.JSON(), created})
	}
	return out
}

// FuzzDecodeObject checks the pure decoding of subscription and invoice objects: no panic, no
// object returned with an error, and an object returned only from a JSON object that carries
// what the handlers rely on (a subscription's id, customer and status; an invoice's id) and what
// the database stores (times in the years 1 to 9999, an attempt_count that fits an integer); the
// derived values (price, period, the invoice's subscription) never panic.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s.object)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		isObject := bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{"))
		s, err := decodeSubscription(raw)
		switch {
		case err != nil && s != nil:
			t.Fatalf("decodeSubscription(%q) returned an object with error %v", raw, err)
		case err == nil && (!isObject || s.ID == "" || s.Customer == "" || s.Status == ""):
			t.Fatalf("decodeSubscription(%q) accepted %+v", raw, s)
		case err == nil:
			_ = s.PriceID()
			start, end := s.Period()
			for _, u := range []unixTime{start, end, s.CancelAt, s.CanceledAt, s.EndedAt, s.TrialStart, s.TrialEnd} {
				if !u.Valid && !u.Time.IsZero() {
					t.Fatalf("decodeSubscription(%q): invalid time %v carries a value", raw, u.Time)
				}
				if (u.Ptr() == nil) == u.Valid {
					t.Fatalf("decodeSubscription(%q): Ptr disagrees with Valid", raw)
				}
				if u.Valid && (u.Time.Year() < 1 || u.Time.Year() > 9999) {
					t.Fatalf("decodeSubscription(%q): accepted a time in the year %d", raw, u.Time.Year())
				}
			}
		}
		inv, err := decodeInvoice(raw)
		switch {
		case err != nil && inv != nil:
			t.Fatalf("decodeInvoice(%q) returned an object with error %v", raw, err)
		case err == nil && (!isObject || inv.ID == ""):
			t.Fatalf("decodeInvoice(%q) accepted %+v", raw, inv)
		case err == nil:
			_ = inv.SubscriptionID()
			if n := inv.NextPaymentAttempt; n.Valid && (n.Time.Year() < 1 || n.Time.Year() > 9999) {
				t.Fatalf("decodeInvoice(%q): accepted a time in the year %d", raw, n.Time.Year())
			}
			if n := inv.AttemptCount; n != nil && (*n < math.MinInt32 || *n > math.MaxInt32) {
				t.Fatalf("decodeInvoice(%q): accepted attempt_count %d", raw, *n)
			}
		}
	})
}

// maxEventCreated is the latest "created" (9999-12-31T23:59:59Z) the inbox accepts.
const maxEventCreated = 253402300799

var (
	errFuzzRollback   = errors.New("fuzz: roll back")
	errFuzzUnstorable = errors.New("fuzz: jsonb refuses the object")
)

// FuzzHandleEvent runs the registered handler of a handled type on a fuzzed data.object, in a
// transaction that is always rolled back, on one database created for the target with a few
// committed rows (an active subscription with a payment hold, a canceled one, a linked customer)
// for the ordering guards, terminal states and customer checks to bite on. The object first goes
// through PostgreSQL's jsonb as the inbox stores it (objects jsonb refuses are never stored, so
// never handled), and the handler gets jsonb's rendering, as the worker does.
//
// Asserted: no panic; an object the decoder refuses ends in a webhooks.IsPermanent error; any
// other error is permanent too (with nothing else using the database, an error that a retry could
// fix does not exist here: a non-permanent one means malformed input that would be retried until
// dead-lettered, or a handler bug).
func FuzzHandleEvent(f *testing.F) {
	seeds := fuzzSeeds(f)
	for _, s := range seeds {
		f.Add(s.typ, s.object, s.created)
	}

	db := testenv.DB(f)
	sqlDB, err := db.DB()
	if err != nil {
		f.Fatal(err)
	}
	rc, err := river.NewClient(riverdatabasesql.New(sqlDB), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	now := time.Unix(base+1000, 0).UTC()
	svc := New(Deps{DB: db, Jobs: rc, Now: func() time.Time { return now }})
	reg := webhooks.NewRegistry()
	svc.Register(reg)
	ctx := context.Background()
	handle := func(tx *gorm.DB, ev webhooks.Event) error {
		h, ok := reg.Lookup(ev.Type)
		if !ok {
			return errors.New("no handler for " + ev.Type)
		}
		return h.HandleEvent(ctx, tx, ev)
	}
	for _, ev := range []webhooks.Event{
		event("evt_seed_1", EventSubscriptionCreated, 1, subObj{ID: "sub_fuzz_1", Customer: "cus_fuzz_1", Status: StatusActive, Price: "price_1", PeriodEnd: 100}.JSON()),
		event("evt_seed_2", EventInvoicePaymentFailed, 2, invObj{ID: "in_fuzz_0", Customer: "cus_fuzz_1", Subscription: "sub_fuzz_1", AttemptCount: 1}.JSON()),
		event("evt_seed_3", EventSubscriptionDeleted, 3, subObj{ID: "sub_fuzz_2", Customer: "cus_fuzz_2", Status: StatusCanceled}.JSON()),
	} {
		if err := db.Transaction(func(tx *gorm.DB) error { return handle(tx, ev) }); err != nil {
			f.Fatalf("seed %s: %v", ev.ID, err)
		}
	}
	if err := db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('user_fuzz_1', 'cus_fuzz_1', 'u1@example.com')`).Error; err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, typIndex uint8, object []byte, created int64) {
		typ := fuzzTypes[int(typIndex)%len(fuzzTypes)]
		ev := webhooks.Event{ID: "evt_fuzz", Type: typ, APIVersion: webhooks.PinnedAPIVersion}
		// As the inbox reads an event's created; it refuses one after maxEventCreated, so
		// larger values are folded into the range rather than skipped.
		if created > 0 {
			ev.Created = time.Unix(created%(maxEventCreated+1), 0).UTC()
		}
		var handleErr error
		var panicked any
		txErr := db.Transaction(func(tx *gorm.DB) error {
			var stored []string
			err := tx.Raw(`SELECT CAST(CAST(? AS text) AS jsonb)::text`, string(object)).Scan(&stored).Error
			var pgErr *pgconn.PgError
			switch {
			case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"): // data exception
				return errFuzzUnstorable
			case err != nil:
				return err
			case len(stored) != 1:
				return errors.New("jsonb round trip returned no row")
			}
			ev.Object = json.RawMessage(stored[0])
			func() {
				defer func() { panicked = recover() }()
				handleErr = handle(tx, ev)
			}()
			return errFuzzRollback
		})
		if panicked != nil {
			t.Fatalf("%s with object %q panicked: %v", typ, ev.Object, panicked)
		}
		if errors.Is(txErr, errFuzzUnstorable) {
			return
		}
		if !errors.Is(txErr, errFuzzRollback) {
			t.Fatalf("transaction: %v", txErr)
		}
		var decodeErr error
		if isInvoiceType(typ) {
			_, decodeErr = decodeInvoice(ev.Object)
		} else {
			_, decodeErr = decodeSubscription(ev.Object)
		}
		switch {
		case decodeErr != nil && handleErr == nil:
			t.Fatalf("%s with object %q: decoding fails (%v) but the handler succeeded", typ, ev.Object, decodeErr)
		case handleErr != nil && !webhooks.IsPermanent(handleErr):
			t.Fatalf("%s (created %d) with object %q: non-permanent error %v", typ, created, ev.Object, handleErr)
		}
	})
}
