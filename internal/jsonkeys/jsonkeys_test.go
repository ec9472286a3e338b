package jsonkeys

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"billing/internal/stripeevents"
)

func nested(open, close string, n int, inner string) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want error // nil, or the sentinel the error must match
	}{
		{"object", `{"id":"evt_1","type":"a.b","data":{"object":{"id":"x"}}}`, nil},
		{"white space around", " \t\r\n{\"a\" : [ 1 , 2 ] }\n ", nil},
		{"scalars", `"s"`, nil},
		{"null", `null`, nil},
		{"array of objects with the same keys", `[{"k":1,"K2":2},{"k":1,"K2":2}]`, nil},
		{"same key in nested objects", `{"a":{"a":{"a":1}}}`, nil},
		{"string value equal to a key", `{"a":"A","A2":"a"}`, nil},
		{"empty containers", `{"a":{},"b":[],"c":[{}]}`, nil},
		{"duplicate key", `{"id":"evt_1","id":"evt_2"}`, ErrDuplicateKey},
		{"case variant", `{"type":"a","TYPE":"b"}`, ErrDuplicateKey},
		{"mixed case variant", `{"Livemode":true,"livemode":false}`, ErrDuplicateKey},
		{"escaped key", `{"type":1,"\u0074ype":2}`, ErrDuplicateKey},
		{"escaped upper-case key", `{"type":1,"\u0054YPE":2}`, ErrDuplicateKey},
		{"Kelvin sign folds to k", "{\"k\":1,\"\u212a\":2}", ErrDuplicateKey},
		{"long s folds to s", "{\"s\":1,\"\u017f\":2}", ErrDuplicateKey},
		{"non-ASCII case", `{"é":1,"É":2}`, ErrDuplicateKey},
		{"sharp s is not SS", `{"ß":1,"SS":2}`, nil},
		{"nested duplicate", `{"data":{"object":{"id":1,"ID":2}}}`, ErrDuplicateKey},
		{"duplicate in an array element", `[1,{"a":1,"b":{},"a":2}]`, ErrDuplicateKey},
		{"duplicate after a large object's 16th key", bigObject(40, `"k7"`), ErrDuplicateKey},
		{"large object without duplicates", bigObject(40, ""), nil},
		{"invalid UTF-8 keys decode alike", "{\"\xff\":1,\"\xfe\":2}", ErrDuplicateKey},
		{"depth 64", nested("[", "]", MaxDepth, ""), nil},
		{"depth 65", nested("[", "]", MaxDepth+1, ""), ErrTooDeep},
		{"objects at depth 65", nested(`{"a":`, "}", MaxDepth+1, "1"), ErrTooDeep},
		{"deep and unterminated", strings.Repeat("[", 100000), ErrTooDeep},
		{"trailing value", `{} {}`, ErrTrailingData},
		{"trailing garbage", `{"a":1}x`, ErrTrailingData},
		{"trailing bracket", `{"a":1}}`, ErrTrailingData},
		{"two numbers", `1 2`, ErrTrailingData},
		{"empty", ``, ErrInvalid},
		{"only space", `  `, ErrInvalid},
		{"unterminated", `{"a":1`, ErrInvalid},
		{"trailing comma", `{"a":1,}`, ErrInvalid},
		{"bad literal", `{"a":tru}`, ErrInvalid},
		{"number beyond float64", `{"a":1e400}`, ErrInvalid},
		{"key not a string", `{1:2}`, ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := Check([]byte(tc.in))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Check(%.80q) = %v, want nil", tc.in, err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Check(%.80q) = %v, want %v", tc.in, err, tc.want)
			}
			for _, other := range []error{ErrDuplicateKey, ErrTooDeep, ErrTrailingData, ErrInvalid} {
				if other != tc.want && errors.Is(err, other) {
					t.Errorf("error %v also matches %v", err, other)
				}
			}
		})
	}
}

// bigObject is an object of n keys k0…k{n-1}, plus extra (a key) as its last member if given.
func bigObject(n int, extra string) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		fmt.Fprintf(&b, `"k%d":%d,`, i, i)
	}
	if extra != "" {
		b.WriteString(extra + `:0,`)
	}
	b.WriteString(`"end":true}`)
	return b.String()
}

func TestDuplicateKeyErrorNamesBothKeys(t *testing.T) {
	t.Parallel()
	err := Check([]byte(`{"a":{"type":1,"x":2,"TYPE":3}}`))
	var dup *DuplicateKeyError
	if !errors.As(err, &dup) || dup.First != "type" || dup.Second != "TYPE" {
		t.Fatalf("error %#v, want a DuplicateKeyError of type and TYPE", err)
	}
}

// A closed object's keys must not leak into its sibling at the same depth (the walk reuses
// frames).
func TestSiblingObjectsDoNotShareKeys(t *testing.T) {
	t.Parallel()
	in := `{"a":{` + strings.TrimSuffix(strings.TrimPrefix(bigObject(20, ""), "{"), "}") + `},"b":{"k3":1,"end":2},"c":[{"k1":1},{"k1":2}]}`
	if err := Check([]byte(in)); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := Check([]byte(`[{"x":1},{"x":1,"X":2}]`)); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("duplicate in the second of two siblings: %v", err)
	}
}

// fold must agree exactly with strings.EqualFold. For every rune, its representative is in its
// case-folding orbit and is the same for every rune of the orbit; since fold maps rune by rune
// and EqualFold compares rune by rune, the strings' representatives are then equal exactly when
// EqualFold holds.
func TestFoldMatchesEqualFold(t *testing.T) {
	t.Parallel()
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		rep := foldRune(r)
		if !strings.EqualFold(string(r), string(rep)) {
			t.Fatalf("foldRune(%U) = %U, not in its orbit", r, rep)
		}
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if foldRune(f) != rep {
				t.Fatalf("foldRune(%U) = %U but foldRune(%U) = %U, same orbit", r, rep, f, foldRune(f))
			}
		}
	}
	for _, pair := range [][2]string{{"type", "TYPE"}, {"Type", "tYPE"}, {"k", "\u212a"}, {"straße", "STRASSE"}, {"ǅ", "ǆ"}, {"id", "ıd"}, {"ab", "a"}} {
		if got, want := fold(pair[0]) == fold(pair[1]), strings.EqualFold(pair[0], pair[1]); got != want {
			t.Errorf("fold(%q) == fold(%q) is %v, EqualFold says %v", pair[0], pair[1], got, want)
		}
	}
}

// benchEvent is a realistic invoice event of about size bytes (Stripe's are 2–10 KB).
func benchEvent(b *testing.B, size int) []byte {
	b.Helper()
	raw, err := stripeevents.Sample("invoice.payment_succeeded", "bench", time.Unix(1717200000, 0), false)
	if err != nil {
		b.Fatal(err)
	}
	var ev map[string]any
	if err := json.Unmarshal(raw, &ev); err != nil {
		b.Fatal(err)
	}
	obj := ev["data"].(map[string]any)["object"].(map[string]any)
	var lines []any
	for i := 0; len(raw) < size; i++ {
		lines = append(lines, map[string]any{
			"id": fmt.Sprintf("il_%d", i), "object": "line_item", "amount": 2000, "currency": "usd",
			"description": "1 × Pro (at $20.00 / month)", "livemode": false, "quantity": 1,
			"period":   map[string]any{"start": 1717200000, "end": 1719792000},
			"price":    map[string]any{"id": "price_monthly", "object": "price", "active": true, "unit_amount": 2000, "recurring": map[string]any{"interval": "month", "interval_count": 1}},
			"metadata": map[string]any{}, "discounts": []any{}, "tax_amounts": []any{},
		})
		obj["lines"] = map[string]any{"object": "list", "data": lines, "has_more": false}
		if raw, err = json.Marshal(ev); err != nil {
			b.Fatal(err)
		}
	}
	return raw
}

func BenchmarkCheckKeys(b *testing.B) {
	for _, size := range []int{2 << 10, 10 << 10} {
		body := benchEvent(b, size)
		if err := Check(body); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%dKB", len(body)>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := Check(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
