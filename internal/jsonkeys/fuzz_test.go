package jsonkeys

// The seed corpus runs as an ordinary test; a longer run:
//
//	go test -run '^$' -fuzz '^FuzzCheckKeys$' ./internal/jsonkeys/

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"billing/internal/stripeevents"
)

// FuzzCheckKeys checks Check against an independent reading: a byte-level walk of the document's
// structure (refScan) that decodes each key with encoding/json and compares every pair of keys of
// an object with strings.EqualFold. Asserted, for every input: no panic; exactly one of the four
// documented errors; acceptance if and only if encoding/json decodes the input (into any, and
// into map[string]any when it is an object), refScan finds no two keys of one object equal under
// case folding, and nothing nests deeper than MaxDepth; and each rejection is explained: a
// duplicate names two keys that fold alike (and refScan finds a duplicate when the input is JSON),
// too deep is deeper than MaxDepth, trailing data is not JSON, invalid is what encoding/json
// refuses too.
func FuzzCheckKeys(f *testing.F) {
	for _, typ := range []string{"customer.subscription.updated", "invoice.payment_failed", "customer.created"} {
		b, err := stripeevents.Sample(typ, "fuzz", time.Unix(1717200000, 0), false)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		``, ` `, `null`, `true`, `0`, `-1.5e3`, `"s"`, `[]`, `{}`, `{"a":1}`, `[{"a":1},{"a":2}]`,
		`{"id":"evt_1","id":"evt_2"}`,
		`{"type":"a","TYPE":"b"}`,
		`{"type":"a","Type":"b"}`,
		`{"a":{"b":1,"B":2}}`,
		`{"a":{"b":1},"A":{"b":1}}`,
		`{"type":1,"\u0074ype":2}`,
		`{"a\u0000":1,"a":2}`,
		"{\"k\":1,\"\u212a\":2}",
		"{\"s\":1,\"\u017f\":2}",
		`{"ß":1,"SS":2,"ss":3}`,
		`{"é":1,"É":2}`,
		"{\"\xff\":1,\"\xfe\":2}",
		"{\"\xff\":1}",
		"\"\xff\"",
		`{"a":"\ud800"}`,
		strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth),
		strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
		strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1),
		strings.Repeat("[", MaxDepth+1),
		`{} {}`, `{}x`, `{}}`, `1 2`, `{"a":1}` + "\n", `"a""b"`,
		`{"a":1,}`, `{"a"}`, `{"a":1`, `[1,]`, `{1:2}`, `{"a":1e400}`, `{"a":-0}`, `{"a":01}`,
	} {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		err := Check(data)
		kinds := 0
		for _, e := range []error{ErrDuplicateKey, ErrTooDeep, ErrTrailingData, ErrInvalid} {
			if errors.Is(err, e) {
				kinds++
			}
		}
		if err != nil && kinds != 1 {
			t.Fatalf("Check(%q) = %v, matching %d of the documented errors", data, err, kinds)
		}

		var v any
		decodes := json.Unmarshal(data, &v) == nil
		if _, isObject := v.(map[string]any); decodes && isObject {
			var m map[string]any
			if uerr := json.Unmarshal(data, &m); uerr != nil {
				t.Fatalf("%q decodes into any as an object, not into map[string]any: %v", data, uerr)
			}
		}
		var dup bool
		var depth int
		if json.Valid(data) {
			dup, depth = refScan(t, data)
		}
		clean := decodes && !dup && depth <= MaxDepth
		switch {
		case err == nil && !clean:
			t.Fatalf("Check accepts %q: decodes %v, duplicate key %v, depth %d", data, decodes, dup, depth)
		case err != nil && clean:
			t.Fatalf("Check refuses %q (%v), which decodes with no duplicate key at depth %d", data, err, depth)
		case errors.Is(err, ErrDuplicateKey):
			var d *DuplicateKeyError
			if !errors.As(err, &d) || !strings.EqualFold(d.First, d.Second) {
				t.Fatalf("Check(%q) = %v, not two keys that fold alike", data, err)
			}
			if json.Valid(data) && !dup {
				t.Fatalf("Check(%q) = %v, but no object has two such keys", data, err)
			}
		case errors.Is(err, ErrTooDeep):
			if json.Valid(data) && depth <= MaxDepth {
				t.Fatalf("Check(%q) = %v at depth %d", data, err, depth)
			}
		case errors.Is(err, ErrTrailingData):
			if json.Valid(data) {
				t.Fatalf("Check(%q) = %v, but it is one JSON value", data, err)
			}
		case errors.Is(err, ErrInvalid):
			if decodes {
				t.Fatalf("Check(%q) = %v, but encoding/json decodes it", data, err)
			}
		}
	})
}

// refScan walks a valid JSON document byte by byte. It returns whether some object has two keys
// equal under strings.EqualFold (each key decoded by encoding/json, whose reading is the one that
// matters), and the deepest nesting of objects and arrays.
func refScan(t *testing.T, data []byte) (dup bool, depth int) {
	t.Helper()
	type open struct {
		object bool
		keys   []string
	}
	var stack []open
	// afterKeyable: the last structural byte was '{' or ',' (the next string in an object is a
	// key).
	afterKeyable := false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '{', '[':
			stack = append(stack, open{object: c == '{'})
			depth = max(depth, len(stack))
			afterKeyable = c == '{'
		case '}', ']':
			stack = stack[:len(stack)-1]
			afterKeyable = false
		case ',':
			afterKeyable = true
		case ':':
			afterKeyable = false
		case '"':
			end := i + 1
			for data[end] != '"' {
				if data[end] == '\\' {
					end++
				}
				end++
			}
			if n := len(stack); n > 0 && stack[n-1].object && afterKeyable {
				var k string
				if err := json.Unmarshal(data[i:end+1], &k); err != nil {
					t.Fatalf("key %q: %v", data[i:end+1], err)
				}
				for _, other := range stack[n-1].keys {
					dup = dup || strings.EqualFold(other, k)
				}
				stack[n-1].keys = append(stack[n-1].keys, k)
			}
			afterKeyable = false
			i = end
		}
	}
	return dup, depth
}
