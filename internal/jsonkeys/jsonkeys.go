// Package jsonkeys refuses JSON documents that different readers may read differently. Go's
// encoding/json matches object keys to struct fields case-insensitively and keeps the last of
// duplicate keys it matches, PostgreSQL's jsonb keeps the last exact duplicate, other readers keep
// the first: a document with keys "type" and "TYPE" (or two "id") can mean one thing to the code
// that checks it and another to the code that stores or processes it. Check accepts only
// documents in which no object has two keys equal under simple Unicode case folding (the folding
// of strings.EqualFold and of encoding/json), nested no deeper than MaxDepth, with nothing after
// the value.
package jsonkeys

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of objects and arrays Check accepts. Stripe's events nest a
// handful of levels; the bound keeps the walk's memory small whatever the input.
const MaxDepth = 64

// Check errors; every error Check returns matches exactly one of them with errors.Is.
var (
	// ErrDuplicateKey: an object has two keys that are equal under case folding.
	ErrDuplicateKey = errors.New("duplicate object key")
	// ErrTooDeep: objects and arrays nest deeper than MaxDepth.
	ErrTooDeep = errors.New("JSON nested too deep")
	// ErrTrailingData: something other than white space follows the value.
	ErrTrailingData = errors.New("data after the JSON value")
	// ErrInvalid: not JSON that encoding/json decodes into an interface value (syntax, a
	// number out of float64's range, an empty input).
	ErrInvalid = errors.New("invalid JSON")
)

// DuplicateKeyError names the two keys (as decoded) of one object that fold to the same key.
type DuplicateKeyError struct {
	First, Second string
}

func (e *DuplicateKeyError) Error() string {
	if e.First == e.Second {
		return fmt.Sprintf("duplicate object key %q", e.Second)
	}
	return fmt.Sprintf("duplicate object key: %q and %q differ only in case", e.First, e.Second)
}

// Is makes a *DuplicateKeyError match ErrDuplicateKey.
func (e *DuplicateKeyError) Is(target error) bool { return target == ErrDuplicateKey }

// smallObject is how many keys an object holds before its keys go into a map: below, a linear
// scan of a reused slice is cheaper than a map and allocates nothing; above, the map keeps a
// large object linear rather than quadratic.
const smallObject = 16

type key struct{ folded, raw string }

// frame is one open object or array.
type frame struct {
	object  bool
	wantKey bool // in an object: the next token is a key or its '}'
	keys    []key
	set     map[string]string // folded → raw, once the object has more than smallObject keys
}

// add records k in the object, or returns the error naming the key it duplicates.
func (f *frame) add(raw string) error {
	folded := fold(raw)
	if f.set != nil {
		if first, dup := f.set[folded]; dup {
			return &DuplicateKeyError{First: first, Second: raw}
		}
		f.set[folded] = raw
		return nil
	}
	for _, k := range f.keys {
		if k.folded == folded {
			return &DuplicateKeyError{First: k.raw, Second: raw}
		}
	}
	f.keys = append(f.keys, key{folded, raw})
	if len(f.keys) > smallObject {
		f.set = make(map[string]string, 2*len(f.keys))
		for _, k := range f.keys {
			f.set[k.folded] = k.raw
		}
	}
	return nil
}

// Check reports whether data is one JSON value that every reader reads alike (see the package
// documentation), with a token-by-token walk: it stops at the first problem and holds only the
// keys of the open objects.
func Check(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	stack := make([]frame, 0, 8)
	done := false
	for {
		tok, err := dec.Token()
		if done {
			if err == io.EOF {
				return nil
			}
			return ErrTrailingData
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		if n := len(stack); n > 0 && stack[n-1].wantKey {
			top := &stack[n-1]
			if k, ok := tok.(string); ok {
				if err := top.add(k); err != nil {
					return err
				}
				top.wantKey = false
				continue
			}
			// Otherwise the object's '}': the decoder allows nothing else here.
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if len(stack) == MaxDepth {
				return fmt.Errorf("%w: more than %d levels", ErrTooDeep, MaxDepth)
			}
			// Reuse the frame (and its key slice) a closed sibling left at this depth.
			if len(stack) < cap(stack) {
				stack = stack[:len(stack)+1]
			} else {
				stack = append(stack, frame{})
			}
			f := &stack[len(stack)-1]
			f.object = tok == json.Delim('{')
			f.wantKey = f.object
			f.keys = f.keys[:0]
			f.set = nil
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the document, or the member or element of the enclosing container.
		if len(stack) == 0 {
			done = true
		} else if top := &stack[len(stack)-1]; top.object {
			top.wantKey = true
		}
	}
}

// fold returns the representative of s's case-folding class: two strings fold to the same
// string exactly when strings.EqualFold reports them equal.
func fold(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf || 'A' <= c && c <= 'Z' {
			return foldSlow(s)
		}
	}
	return s // lower-case ASCII, the usual key, is its own representative
}

func foldSlow(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		b.WriteRune(foldRune(r))
	}
	return b.String()
}

// foldRune returns the representative of the orbit of r under unicode.SimpleFold (the runes
// strings.EqualFold treats as equal): its ASCII lower-case letter if it has one (so that 'K',
// 'k' and the Kelvin sign agree with the fast path of fold), else its smallest rune.
func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}
	rep, ascii := r, rune(-1)
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		rep = min(rep, f)
		if 'a' <= f && f <= 'z' {
			ascii = f
		}
	}
	if ascii >= 0 {
		return ascii
	}
	return rep
}
