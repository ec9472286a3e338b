package webhooks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"billing/internal/apierr"
	"billing/internal/jsonkeys"
)

// envelope is the part of an event the inbox reads; handlers get the rest.
type envelope struct {
	ID         string     `json:"id"`
	Object     string     `json:"object"`
	Type       string     `json:"type"`
	Livemode   *bool      `json:"livemode"`
	APIVersion *string    `json:"api_version"`
	Created    int64      `json:"created"`
	Data       *eventData `json:"data"`
}

func (e envelope) key() EventKey { return EventKey{ID: e.ID, Livemode: *e.Livemode} }

func (e envelope) apiVersion() string {
	if e.APIVersion == nil {
		return ""
	}
	return *e.APIVersion
}

type eventData struct {
	Object             json.RawMessage `json:"object"`
	PreviousAttributes json.RawMessage `json:"previous_attributes"`
}

// checkEnvelope checks that an envelope read from a body is a Stripe event the inbox can store.
func checkEnvelope(env envelope) error {
	switch {
	case env.Object != "event":
		return errors.New(`body is not a Stripe event: "object" is not "event"`)
	case env.ID == "" || len(env.ID) > 255:
		return errors.New(`event has no valid "id"`)
	case env.Type == "" || len(env.Type) > 255:
		return errors.New(`event has no valid "type"`)
	case env.Livemode == nil:
		return errors.New(`event has no "livemode"`)
	case env.Data == nil || len(bytes.TrimSpace(env.Data.Object)) == 0:
		return errors.New(`event has no "data.object"`)
	case env.Created > maxCreated:
		return errors.New(`event has no valid "created"`)
	}
	return nil
}

// maxCreated (9999-12-31T23:59:59Z) bounds an event's "created": beyond, pgx silently wraps the
// timestamp or PostgreSQL refuses it (a 500 that Stripe would retry for days).
const maxCreated = 253402300799

// readEvent reads a verified body in one walk (jsonkeys.Scan): the duplicate-key verdict, and
// the envelope from the walk's members, with data.object and data.previous_attributes as slices
// of the body, which the handler decodes. The verdict comes first: the envelope's keys match
// case-insensitively (as encoding/json matches them) and PostgreSQL's jsonb keeps the last of
// exact duplicates, so a body with "type" and "TYPE", or two "id", could be checked as one event
// and stored as another.
func readEvent(body []byte) (envelope, apierr.Code, error) {
	members, err := jsonkeys.Scan(body)
	if err != nil {
		if errors.Is(err, jsonkeys.ErrDuplicateKey) {
			return envelope{}, apierr.CodeAmbiguousJSON, fmt.Errorf("body is ambiguous JSON: %w", err)
		}
		return envelope{}, apierr.CodeNotAnEvent, fmt.Errorf("body is not a JSON event: %w", err)
	}
	env, err := envelopeOf(body, members)
	if err == nil {
		err = checkEnvelope(env)
	}
	if err != nil {
		return env, apierr.CodeNotAnEvent, err
	}
	return env, "", nil
}

// envelopeOf reads the envelope from the members of a checked body exactly as json.Unmarshal
// into envelope reads it (FuzzDecodeEnvelope holds them equal): a key takes the field of its
// exact name, else of its name under encoding/json's folding; null leaves a value and clears a
// pointer; a value of another JSON type is an error.
func envelopeOf(body []byte, members []jsonkeys.Member) (envelope, error) {
	var env envelope
	if b := bytes.TrimSpace(body); len(b) == 0 || b[0] != '{' {
		if string(b) == "null" {
			return env, nil
		}
		return env, errors.New("body is not a JSON event: not an object")
	}
	for _, m := range members {
		var ok bool
		switch fieldOf(m.Key, "id", "object", "type", "livemode", "api_version", "created", "data") {
		case "id":
			ok = jsonString(m.Value, &env.ID)
		case "object":
			ok = jsonString(m.Value, &env.Object)
		case "type":
			ok = jsonString(m.Value, &env.Type)
		case "livemode":
			switch string(m.Value) {
			case "true", "false":
				v := m.Value[0] == 't'
				env.Livemode, ok = &v, true
			case "null":
				env.Livemode, ok = nil, true
			}
		case "api_version":
			if string(m.Value) == "null" {
				env.APIVersion, ok = nil, true
			} else {
				var v string
				if ok = jsonString(m.Value, &v); ok {
					env.APIVersion = &v
				}
			}
		case "created":
			ok = jsonInt(m.Value, &env.Created)
		case "data":
			switch m.Value[0] {
			case 'n':
				env.Data, ok = nil, true
			case '{':
				if env.Data == nil {
					env.Data = &eventData{}
				}
				for _, d := range m.Members {
					switch fieldOf(d.Key, "object", "previous_attributes") {
					case "object":
						env.Data.Object = d.Value
					case "previous_attributes":
						env.Data.PreviousAttributes = d.Value
					}
				}
				ok = true
			}
		default:
			ok = true
		}
		if !ok {
			return env, fmt.Errorf("body is not a JSON event: %q has the wrong type", m.Key)
		}
	}
	return env, nil
}

// fieldOf is the name among names that key selects, as encoding/json selects a struct field:
// the exact name, else the one equal under its folding; "" for none.
func fieldOf(key string, names ...string) string {
	for _, n := range names {
		if key == n {
			return n
		}
	}
	folded := foldName(key)
	for _, n := range names {
		if folded == foldName(n) {
			return n
		}
	}
	return ""
}

// foldName is encoding/json's folding of field names: ASCII letters upper-cased, other runes
// mapped to the smallest rune of their simple folding orbit (so that foldName(x) == foldName(y)
// exactly when strings.EqualFold(x, y), the equality jsonkeys refuses duplicates by).
func foldName(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		switch {
		case 'a' <= r && r <= 'z':
			b = append(b, byte(r-'a'+'A'))
		case r < utf8.RuneSelf:
			b = append(b, byte(r))
		default:
			for {
				f := unicode.SimpleFold(r)
				if f <= r {
					r = f
					break
				}
				r = f
			}
			b = utf8.AppendRune(b, r)
		}
	}
	return string(b)
}

// jsonString decodes a JSON string into *dst (null leaves it); false for another type.
func jsonString(v []byte, dst *string) bool {
	switch v[0] {
	case 'n':
		return true
	case '"':
	default:
		return false
	}
	if bytes.IndexByte(v, '\\') < 0 && isASCII(v) {
		*dst = string(v[1 : len(v)-1])
		return true
	}
	return json.Unmarshal(v, dst) == nil
}

// jsonInt decodes a JSON number that is an int64, as encoding/json does (null leaves *dst).
func jsonInt(v []byte, dst *int64) bool {
	if string(v) == "null" {
		return true
	}
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return false
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return false
	}
	*dst = n
	return true
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
