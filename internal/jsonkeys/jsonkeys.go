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
	"strconv"
	"strings"
	"sync"
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

// key is a key of an open object: its folded form (a slice of the document for the usual
// lower-case ASCII key, else a copy) and its quoted text in the document.
type key struct{ folded, quoted []byte }

// frame is one open object.
type frame struct {
	keys []key
	set  map[string]int // folded → index in keys, once the object has more than smallObject keys
}

// add records the key quoted (plain: without escapes or non-ASCII bytes), or returns the error
// naming the key it duplicates.
func (f *frame) add(quoted []byte, plain bool) error {
	folded := quoted[1 : len(quoted)-1]
	if !plain || hasUpper(folded) {
		folded = []byte(fold(decodeKey(quoted, plain)))
	}
	if f.set != nil {
		if i, dup := f.set[string(folded)]; dup {
			return &DuplicateKeyError{First: decodeKey(f.keys[i].quoted, false), Second: decodeKey(quoted, plain)}
		}
		f.set[string(folded)] = len(f.keys)
	} else {
		for _, k := range f.keys {
			if bytes.Equal(k.folded, folded) {
				return &DuplicateKeyError{First: decodeKey(k.quoted, false), Second: decodeKey(quoted, plain)}
			}
		}
	}
	f.keys = append(f.keys, key{folded, quoted})
	if f.set == nil && len(f.keys) > smallObject {
		f.set = make(map[string]int, 2*len(f.keys))
		for i, k := range f.keys {
			f.set[string(k.folded)] = i
		}
	}
	return nil
}

func hasUpper(b []byte) bool {
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			return true
		}
	}
	return false
}

// decodeKey is the string a quoted key decodes to, as encoding/json decodes it (escapes, and
// U+FFFD for invalid UTF-8).
func decodeKey(quoted []byte, plain bool) string {
	if plain {
		return string(quoted[1 : len(quoted)-1])
	}
	var s string
	if err := json.Unmarshal(quoted, &s); err != nil {
		return string(quoted) // not reached: the scanner checked the string
	}
	return s
}

// Member is a member of an object: its key, decoded as encoding/json decodes it, and its value,
// a slice of the document.
type Member struct {
	Key   string
	Value []byte
	// Members are the members of Value when it is an object and this is a member of the
	// document's own object (two levels: an event's envelope and its data); nil otherwise.
	Members []Member
}

// Check reports whether data is one JSON value that every reader reads alike (see the package
// documentation), in one walk of its bytes: it stops at the first problem and holds only the
// keys of the open objects.
func Check(data []byte) error {
	_, err := scan(data, false)
	return err
}

// Scan is Check that also returns, when the document is an object, its members and those of its
// members' objects, as slices of data: one walk gives the verdict and what an event's envelope
// is read from.
func Scan(data []byte) ([]Member, error) {
	return scan(data, true)
}

// scanner walks a document. It accepts what encoding/json decodes into an interface value: its
// grammar, and numbers within float64's range.
type scanner struct {
	data   []byte
	pos    int
	frames []frame // the open objects' keys, by depth, reused by siblings
}

var scanners = sync.Pool{New: func() any { return &scanner{frames: make([]frame, 0, 8)} }}

func scan(data []byte, record bool) ([]Member, error) {
	s := scanners.Get().(*scanner)
	defer func() {
		// Nothing of the document stays reachable from the pool.
		s.data = nil
		for i := range s.frames {
			clear(s.frames[i].keys[:cap(s.frames[i].keys)])
			s.frames[i].set = nil
		}
		scanners.Put(s)
	}()
	s.data, s.pos = data, 0
	s.space()
	if s.pos == len(data) {
		return nil, s.invalid("unexpected end of JSON input")
	}
	var top []Member
	var err error
	if record && data[s.pos] == '{' {
		top, err = s.object(1, 2)
	} else {
		err = s.value(0)
	}
	if err != nil {
		return nil, err
	}
	if s.space(); s.pos != len(data) {
		return nil, ErrTrailingData
	}
	return top, nil
}

func (s *scanner) invalid(msg string) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalid, msg, s.pos)
}

func (s *scanner) space() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// value scans the value at pos, inside depth open containers.
func (s *scanner) value(depth int) error {
	if s.pos == len(s.data) {
		return s.invalid("unexpected end of JSON input")
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		_, err := s.object(depth+1, 0)
		return err
	case c == '[':
		return s.array(depth + 1)
	case c == '"':
		_, err := s.str()
		return err
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		return s.number()
	}
	return s.invalid(fmt.Sprintf("invalid character %q looking for a value", s.data[s.pos]))
}

// object scans the object at pos, the depth-th open container, and returns its members when
// record > 0 (and theirs, for objects, when record > 1).
func (s *scanner) object(depth, record int) ([]Member, error) {
	if depth > MaxDepth {
		return nil, fmt.Errorf("%w: more than %d levels", ErrTooDeep, MaxDepth)
	}
	for len(s.frames) < depth {
		s.frames = append(s.frames, frame{})
	}
	f := &s.frames[depth-1]
	f.keys, f.set = f.keys[:0], nil
	s.pos++ // '{'
	s.space()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		return nil, nil
	}
	var members []Member
	for {
		s.space()
		if s.pos == len(s.data) || s.data[s.pos] != '"' {
			return nil, s.invalid("expecting an object key")
		}
		start := s.pos
		plain, err := s.str()
		if err != nil {
			return nil, err
		}
		quoted := s.data[start:s.pos]
		// Taken again: a nested object may have grown (moved) the frames.
		f = &s.frames[depth-1]
		if err := f.add(quoted, plain); err != nil {
			return nil, err
		}
		s.space()
		if s.pos == len(s.data) || s.data[s.pos] != ':' {
			return nil, s.invalid("expecting ':' after an object key")
		}
		s.pos++
		s.space()
		vstart := s.pos
		var inner []Member
		if record > 1 && s.pos < len(s.data) && s.data[s.pos] == '{' {
			inner, err = s.object(depth+1, record-1)
		} else {
			err = s.value(depth)
		}
		if err != nil {
			return nil, err
		}
		if record > 0 {
			members = append(members, Member{Key: decodeKey(quoted, plain), Value: s.data[vstart:s.pos], Members: inner})
		}
		s.space()
		if s.pos < len(s.data) {
			switch s.data[s.pos] {
			case ',':
				s.pos++
				continue
			case '}':
				s.pos++
				return members, nil
			}
		}
		return nil, s.invalid("expecting ',' or '}' in an object")
	}
}

func (s *scanner) array(depth int) error {
	if depth > MaxDepth {
		return fmt.Errorf("%w: more than %d levels", ErrTooDeep, MaxDepth)
	}
	s.pos++ // '['
	s.space()
	if s.pos < len(s.data) && s.data[s.pos] == ']' {
		s.pos++
		return nil
	}
	for {
		s.space()
		if err := s.value(depth); err != nil {
			return err
		}
		s.space()
		if s.pos < len(s.data) {
			switch s.data[s.pos] {
			case ',':
				s.pos++
				continue
			case ']':
				s.pos++
				return nil
			}
		}
		return s.invalid("expecting ',' or ']' in an array")
	}
}

// str scans the string at pos; plain reports that it holds neither escapes nor non-ASCII bytes
// (its bytes are its value).
func (s *scanner) str() (plain bool, err error) {
	plain = true
	s.pos++ // '"'
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			return plain, nil
		case c == '\\':
			plain = false
			s.pos++
			if s.pos == len(s.data) {
				return false, s.invalid("unexpected end of JSON input")
			}
			switch s.data[s.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos++
			case 'u':
				if s.pos+5 > len(s.data) {
					return false, s.invalid("unexpected end of JSON input")
				}
				for _, h := range s.data[s.pos+1 : s.pos+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false, s.invalid("invalid \\u escape")
					}
				}
				s.pos += 5
			default:
				return false, s.invalid("invalid escape in a string")
			}
		case c < 0x20:
			return false, s.invalid("control character in a string")
		default:
			plain = plain && c < utf8.RuneSelf
			s.pos++
		}
	}
	return false, s.invalid("unexpected end of JSON input")
}

func (s *scanner) literal(word string) error {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(word)) {
		return s.invalid("invalid literal")
	}
	s.pos += len(word)
	return nil
}

// number scans a number. encoding/json decodes it as a float64: one out of that range (only
// possible with an exponent or hundreds of digits) is refused as it refuses it.
func (s *scanner) number() error {
	start := s.pos
	if s.data[s.pos] == '-' {
		s.pos++
	}
	digits := func() int {
		n := 0
		for s.pos < len(s.data) && '0' <= s.data[s.pos] && s.data[s.pos] <= '9' {
			s.pos++
			n++
		}
		return n
	}
	if s.pos == len(s.data) {
		return s.invalid("unexpected end of JSON input")
	}
	intDigits := 1
	switch c := s.data[s.pos]; {
	case c == '0':
		s.pos++
	case '1' <= c && c <= '9':
		intDigits = digits()
	default:
		return s.invalid("invalid number")
	}
	if s.pos < len(s.data) && s.data[s.pos] == '.' {
		s.pos++
		if digits() == 0 {
			return s.invalid("invalid number: no digit after '.'")
		}
	}
	exponent := false
	if s.pos < len(s.data) && (s.data[s.pos] == 'e' || s.data[s.pos] == 'E') {
		exponent = true
		s.pos++
		if s.pos < len(s.data) && (s.data[s.pos] == '+' || s.data[s.pos] == '-') {
			s.pos++
		}
		if digits() == 0 {
			return s.invalid("invalid number: no digit in the exponent")
		}
	}
	if exponent || intDigits > 300 {
		if _, err := strconv.ParseFloat(string(s.data[start:s.pos]), 64); err != nil {
			return s.invalid("number out of range")
		}
	}
	return nil
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
