package webhooks

// Fuzz targets of the webhook edge. Their seed corpora run as ordinary tests in `make test`;
// `make fuzz` runs each for FUZZTIME:
//
//	go test -run '^$' -fuzz '^FuzzVerifySignature$' ./webhooks/
//	go test -run '^$' -fuzz '^FuzzDecodeEnvelope$' ./webhooks/
//	go test -run '^$' -fuzz '^FuzzCheckKeys$' ./internal/jsonkeys/

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79/webhook"

	"billing/internal/apierr"
	"billing/internal/jsonkeys"
	"billing/internal/stripeevents"
)

var (
	// fuzzNow is the receiver's clock in FuzzVerifySignature: fixed, so that a failing input
	// reproduces whenever it is run.
	fuzzNow         = time.Unix(1717200000, 0)
	fuzzSecrets     = []string{"whsec_fuzz_current", "whsec_fuzz_previous"}
	fuzzOtherSecret = "whsec_fuzz_not_configured"
)

const fuzzTolerance = 5 * time.Minute

func fuzzSign(secret string, ts int64, payload []byte) []byte {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(strconv.FormatInt(ts, 10)))
	mac.Write([]byte("."))
	mac.Write(payload)
	return mac.Sum(nil)
}

// refHeader is an independent reading of a Stripe-Signature header, as Stripe documents it:
// comma-separated "key=value" parts, the timestamp in "t", signatures in "v1".
type refHeader struct {
	t    int64
	hasT bool
	v1   [][]byte // decodable v1 values, in order
}

func refParse(h string) refHeader {
	var r refHeader
	for _, part := range strings.Split(h, ",") {
		part = strings.TrimSpace(part)
		switch {
		case strings.HasPrefix(part, "t="):
			if n, err := strconv.ParseInt(part[len("t="):], 10, 64); err == nil {
				r.t, r.hasT = n, true
			}
		case strings.HasPrefix(part, "v1="):
			if b, err := hex.DecodeString(part[len("v1="):]); err == nil {
				r.v1 = append(r.v1, b)
			}
		}
	}
	return r
}

// canonical reports whether every part of h is exactly "key=value" with no surrounding space:
// the headers on which this package and stripe-go must read the same timestamp and signatures
// (this package also trims spaces and ignores unknown parts with several "=", stripe-go does not).
func canonical(h string) bool {
	for _, part := range strings.Split(h, ",") {
		if strings.Count(part, "=") != 1 || strings.TrimSpace(part) != part {
			return false
		}
	}
	return true
}

// FuzzVerifySignature checks VerifySignature against its specification. The header is a
// template in which {t} becomes the timestamp fuzzNow+offset and {sig} ({SIG}: upper case) the
// v1 signature of that timestamp and the payload under the secret that key picks: one of the two
// configured secrets, or a secret that is not configured; {~sig} and {sig~} are that signature
// with its first or last byte changed.
//
// Asserted, for every input: no panic; only the four documented errors; the same answer as
// parseSignatureHeader when the header does not parse; given the parse, exactly the answer of the
// spec (nil iff one of the first maxSignatures v1 values is the HMAC of "<t>.<payload>" under a
// configured secret and t is within the tolerance either side of now; ErrBadSignature when no
// value matches; ErrStaleTimestamp when one matches out of tolerance); acceptance implies that an
// independent reading of the header finds that correct v1 and an in-tolerance t. Differential
// against stripe-go's webhook.ValidatePayloadWithTolerance: on canonical headers, a signature that
// this package accepts is one stripe-go accepts, and a signature stripe-go accepts is accepted
// here unless a documented strictness applies (a malformed v1 or t, more than maxSignatures v1);
// and, on a plain signed header at the real clock, the same tolerance decisions except for
// timestamps in the future beyond the tolerance (rejected here, accepted by stripe-go).
func FuzzVerifySignature(f *testing.F) {
	event, err := stripeevents.Sample("customer.subscription.updated", "fuzz", fuzzNow, false)
	if err != nil {
		f.Fatal(err)
	}
	payloads := [][]byte{event, nil, []byte("{}"), []byte("\x00\xff not json, \u2028")}
	tol := int64(fuzzTolerance / time.Second)
	zeros := strings.Repeat("0", 64)
	for _, tmpl := range []string{
		"t={t},v1={sig}",
		"v1={sig},t={t}",
		"t={t},v1={SIG}",
		"t={t},v1={~sig}",
		"t={t},v1={sig~}",
		"t={t},v1={sig~},v1={~sig}",
		"t={t}, v1={sig}",
		" t={t} ,v1={sig} ",
		"t={t},v0=" + zeros + ",v1={sig}",
		"t={t},v1=" + zeros + ",v1={sig}",
		"t={t},v1=deadbeef,v1={sig}",
		"t={t},v1={sig}0",
		"t={t},v1={sig}=",
		"t={t},v1={sig},x=a=b",
		"t={t},v1={sig},t=1",
		"t=1,t={t},v1={sig}",
		"t=+{t},v1={sig}",
		"t=0{t},v1={sig}",
		"t={t},,v1={sig}",
		"t={t},v1={sig},",
		"t={t}",
		"v1={sig}",
		"t=,v1={sig}",
		"t={t},v1=",
		"t={t},v1=zz" + zeros[2:],
		"t={t}," + strings.Repeat("v1="+zeros+",", maxSignatures) + "v1={sig}",
		"t={t}," + strings.Repeat("v1="+zeros+",", maxSignatures-1) + "v1={sig}",
		"",
		" ",
		",",
		"=",
		"t",
		"t=abc,v1={sig}",
	} {
		f.Add(tmpl, event, int64(0), uint8(0))
	}
	for _, p := range payloads {
		for key := range uint8(3) {
			f.Add("t={t},v1={sig}", p, int64(0), key)
		}
	}
	for _, off := range []int64{1, -1, tol - 1, tol, tol + 1, -tol + 1, -tol, -tol - 1, 86400, -86400,
		-fuzzNow.Unix(), -fuzzNow.Unix() - 1, math.MaxInt64, math.MinInt64, 1 << 40, -(1 << 40)} {
		f.Add("t={t},v1={sig}", event, off, uint8(0))
		f.Add("t={t},v1={sig}", event, off, uint8(1))
	}

	f.Fuzz(func(t *testing.T, tmpl string, payload []byte, offset int64, key uint8) {
		signer := [...]string{fuzzSecrets[0], fuzzSecrets[1], fuzzOtherSecret}[key%3]
		ts := fuzzNow.Unix() + offset
		mac := fuzzSign(signer, ts, payload)
		sig := hex.EncodeToString(mac)
		// Near misses: the signature with its first or last byte changed.
		first, last := slices.Clone(mac), slices.Clone(mac)
		first[0] ^= 1
		last[len(last)-1] ^= 0x80
		header := strings.NewReplacer("{t}", strconv.FormatInt(ts, 10), "{sig}", sig, "{SIG}", strings.ToUpper(sig),
			"{~sig}", hex.EncodeToString(first), "{sig~}", hex.EncodeToString(last)).Replace(tmpl)

		err := VerifySignature(payload, header, fuzzSecrets, fuzzTolerance, fuzzNow)
		switch {
		case err == nil, errors.Is(err, ErrNoSignature), errors.Is(err, ErrMalformedSignature),
			errors.Is(err, ErrBadSignature), errors.Is(err, ErrStaleTimestamp):
		default:
			t.Fatalf("header %q: undocumented error %v", header, err)
		}

		// With the two configured secrets split into one test and one live secret, the answer is
		// the same, and (below) the modes are exactly those whose secret matches.
		modes, merr := VerifySignatureModes(payload, header, fuzzSecrets[:1], fuzzSecrets[1:], fuzzTolerance, fuzzNow)
		if merr != err || (merr == nil) != (modes != 0) {
			t.Fatalf("header %q: VerifySignatureModes says %v (modes %b), VerifySignature %v", header, merr, modes, err)
		}

		// Given the parse, the answer is exactly the specified one.
		h, perr := parseSignatureHeader(header)
		if perr != nil {
			if !errors.Is(perr, ErrNoSignature) && !errors.Is(perr, ErrMalformedSignature) {
				t.Fatalf("header %q: parse error %v is not ErrNoSignature/ErrMalformedSignature", header, perr)
			}
			if err != perr {
				t.Fatalf("header %q: VerifySignature says %v, the parse says %v", header, err, perr)
			}
		} else {
			if h.timestamp <= 0 || len(h.signatures) == 0 || len(h.signatures) > maxSignatures {
				t.Fatalf("header %q parsed to t=%d with %d signatures", header, h.timestamp, len(h.signatures))
			}
			matched, wantModes := false, Modes(0)
			for i, s := range fuzzSecrets {
				want := fuzzSign(s, h.timestamp, payload)
				for _, got := range h.signatures {
					if len(got) != sha256.Size {
						t.Fatalf("header %q: parsed a %d-byte signature", header, len(got))
					}
					if bytes.Equal(got, want) {
						matched = true
						wantModes |= [...]Modes{ModeTest, ModeLive}[i]
					}
				}
			}
			age := fuzzNow.Sub(time.Unix(h.timestamp, 0))
			var want error
			switch {
			case !matched:
				want = ErrBadSignature
			case age > fuzzTolerance || age < -fuzzTolerance:
				want = ErrStaleTimestamp
			}
			if err != want {
				t.Fatalf("header %q (t=%d, signature matches: %v, age %s): got %v, want %v", header, h.timestamp, matched, age, err, want)
			}
			if err == nil && modes != wantModes {
				t.Fatalf("header %q: modes %b, want %b", header, modes, wantModes)
			}
			// No secret at all verifies nothing, and says no more than a wrong secret.
			if m, e := VerifySignatureModes(payload, header, nil, nil, fuzzTolerance, fuzzNow); m != 0 || e != ErrBadSignature {
				t.Fatalf("header %q without secrets: modes %b, %v", header, m, e)
			}
		}

		// Acceptance implies a correct v1 for a configured secret, at an in-tolerance t, read
		// from the header independently of parseSignatureHeader.
		if err == nil {
			r := refParse(header)
			if !r.hasT {
				t.Fatalf("header %q accepted without a timestamp", header)
			}
			if d := fuzzNow.Sub(time.Unix(r.t, 0)); d > fuzzTolerance || d < -fuzzTolerance {
				t.Fatalf("header %q accepted with t=%d, %s from now", header, r.t, d)
			}
			found := false
			for _, s := range fuzzSecrets {
				want := fuzzSign(s, r.t, payload)
				for _, v := range r.v1 {
					found = found || hmac.Equal(v, want)
				}
			}
			if !found {
				t.Fatalf("header %q accepted but holds no correct v1 for t=%d", header, r.t)
			}
		}

		// Differential against stripe-go on the signature alone: a tolerance no age exceeds
		// makes stripe-go's answer depend only on its parse and the HMAC, and here the HMAC is
		// checked before the age (ErrStaleTimestamp means it matched).
		if canonical(header) {
			stripeOK := false
			for _, s := range fuzzSecrets {
				stripeOK = stripeOK || webhook.ValidatePayloadWithTolerance(payload, header, s, time.Duration(math.MaxInt64)) == nil
			}
			oursOK := err == nil || errors.Is(err, ErrStaleTimestamp)
			if oursOK && !stripeOK {
				t.Fatalf("header %q: signature accepted here, rejected by stripe-go", header)
			}
			if stripeOK && !oursOK && !documentedStricter(header, err) {
				t.Fatalf("header %q: signature accepted by stripe-go, rejected here with %v", header, err)
			}
		}

		// Differential on the tolerance: a plain signed header at the real clock (stripe-go
		// reads time.Now itself). Timestamps within 2s of the bounds are skipped (the clocks
		// are read at slightly different instants).
		if key%3 == 2 || offset > 1e9 || offset < -1e9 {
			return
		}
		now := time.Now()
		ts2 := now.Unix() + offset
		if ts2 <= 0 || abs(abs(offset)-tol) <= 2 {
			return
		}
		header2 := "t=" + strconv.FormatInt(ts2, 10) + ",v1=" + hex.EncodeToString(fuzzSign(signer, ts2, payload))
		ours := VerifySignature(payload, header2, fuzzSecrets, fuzzTolerance, now)
		theirs := webhook.ValidatePayloadWithTolerance(payload, header2, signer, fuzzTolerance)
		switch {
		case ours != nil && !errors.Is(ours, ErrStaleTimestamp):
			t.Fatalf("header %q: correctly signed, got %v", header2, ours)
		case ours == nil && theirs != nil:
			t.Fatalf("header %q (offset %ds): accepted here, stripe-go says %v", header2, offset, theirs)
		case theirs == nil && ours != nil && offset <= tol:
			t.Fatalf("header %q (offset %ds): stripe-go accepts, here %v", header2, offset, ours)
		case (ours == nil) != (abs(offset) <= tol):
			t.Fatalf("header %q (offset %ds): got %v with a tolerance of %s", header2, offset, ours, fuzzTolerance)
		}
	})
}

// documentedStricter reports whether err is one of the ways this package is deliberately stricter
// than stripe-go: a v1 that is not a SHA-256 in hex or a missing or non-positive t is malformed
// (stripe-go skips such a v1, and reads a missing t as 1970), and only the first maxSignatures v1
// values are tried.
func documentedStricter(header string, err error) bool {
	var v1 int
	malformedV1, goodT := false, false
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "v1":
			v1++
			if b, derr := hex.DecodeString(v); derr != nil || len(b) != sha256.Size {
				malformedV1 = true
			}
		case "t":
			n, perr := strconv.ParseInt(v, 10, 64)
			goodT = perr == nil && n > 0
		}
	}
	if errors.Is(err, ErrMalformedSignature) {
		return malformedV1 || !goodT
	}
	return errors.Is(err, ErrBadSignature) && v1 > maxSignatures
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// FuzzDecodeEnvelope checks that decodeEnvelope never panics, that what it accepts is a Stripe
// event the inbox can store (a JSON object with "object": "event", an id and a type of 1 to 255
// bytes, a livemode, a non-empty data.object that is valid JSON, a created no later than the
// year 9999), and that the worker's decoding
// of the stored payload (decodeEvent) agrees with the receive path's (readEvent): it refuses the
// same bodies, and for the others carries the same id, type, object and created time. It also checks the receive path's
// reading of a verified body, readEvent (see checkReadEvent).
func FuzzDecodeEnvelope(f *testing.F) {
	now := time.Unix(1717200000, 0)
	for _, typ := range []string{"customer.subscription.created", "customer.subscription.updated", "customer.subscription.deleted",
		"customer.subscription.trial_will_end", "invoice.payment_failed", "invoice.payment_succeeded", "customer.created"} {
		b, err := stripeevents.Sample(typ, "fuzz", now, false)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	paths, _ := filepath.Glob(filepath.Join("..", "billing", "testdata", "stripe-events", "*.json"))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	long := strings.Repeat("x", 256)
	for _, s := range []string{
		``, `null`, `[]`, `"event"`, `{}`, `{"object":"event"}`, `{`, `{"object":"event"}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{"object":null}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{"object":"str"}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":null}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":null,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":"false","data":{"object":{}}}`,
		`{"id":"","object":"event","type":"t","livemode":true,"data":{"object":{}}}`,
		`{"id":"` + long + `","object":"event","type":"t","livemode":true,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"` + long + `","livemode":true,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":true,"created":-5,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":true,"created":1e3,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":true,"created":99999999999999999999,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":true,"created":253402300799,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":true,"created":253402300800,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":true,"created":4611686018427387904,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":true,"api_version":null,"data":{"object":{},"previous_attributes":null}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":true,"data":{"object":{"a":"\u0000"}}}`,
		`{"id":"evt_1","id":"evt_2","object":"event","type":"t","livemode":true,"data":{"object":{}}}`,
		"{\"id\":\"evt_\xff\",\"object\":\"event\",\"type\":\"t\",\"livemode\":true,\"data\":{\"object\":{}}}",
		`  {"id":"evt_1","object":"event","type":"t","livemode":true,"data":{"object":  [ ] }}  `,
		// Keys that encoding/json and jsonb read differently, and bodies jsonkeys refuses.
		`{"id":"evt_1","object":"event","type":"t","TYPE":"u","livemode":false,"data":{"object":{}}}`,
		`{"id":"evt_1","ID":"evt_2","object":"event","type":"t","livemode":false,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":true,"Livemode":false,"data":{"object":{}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{"object":{"a":1,"A":2}}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{"object":{}},"DATA":{"object":{"x":1}}}`,
		`{"id":"evt_1","object":"event","\u0074ype":"t","type":"u","livemode":false,"data":{"object":{}}}`,
		"{\"id\":\"evt_1\",\"object\":\"event\",\"type\":\"t\",\"livemode\":false,\"data\":{\"object\":{\"k\":1,\"\u212a\":2}}}",
		`{"ID":"evt_1","Object":"event","TYPE":"t","livemode":false,"data":{"object":{}}}`,
		// Runes whose case mappings reach ASCII without folding to it: encoding/json reads them
		// as other keys, and so must readEvent.
		`{"id":"evt_a","ıd":"evt_b","object":"event","type":"t","livemode":false,"data":{"object":{}}}`,
		`{"İd":"evt_b","id":"evt_a","object":"event","type":"t","livemode":false,"data":{"object":{}}}`,
		"{\"id\":\"evt_1\",\"object\":\"event\",\"type\":\"t\",\"livemode\":true,\"api_verſion\":\"x\",\"data\":{\"object\":{}}}",
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{"object":{}}} {}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{"object":{}}}x`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{"object":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}}`,
		`{"id":"evt_1","object":"event","type":"t","livemode":false,"data":{"object":{"n":1e400}}}`,
	} {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := decodeEnvelope(body)
		checkReadEvent(t, body, env, err)
		// The worker reads a stored payload as the receive path read its body.
		_, _, rerr := readEvent(body)
		stored := storedEvent{EventID: env.ID, Type: env.Type, Payload: body}
		ev, derr := decodeEvent(stored)
		if rerr != nil {
			if derr == nil {
				t.Fatalf("readEvent refuses %q (%v), decodeEvent accepts it", body, rerr)
			}
			return
		}
		if derr != nil {
			t.Fatalf("readEvent accepts %q, decodeEvent refuses it: %v", body, derr)
		}
		switch {
		case !json.Valid(body):
			t.Fatalf("accepted a body that is not JSON: %q", body)
		case env.Object != "event":
			t.Fatalf("accepted object %q", env.Object)
		case env.ID == "" || len(env.ID) > 255:
			t.Fatalf("accepted id %q", env.ID)
		case env.Type == "" || len(env.Type) > 255:
			t.Fatalf("accepted type %q", env.Type)
		case env.Livemode == nil:
			t.Fatal("accepted an event without livemode")
		case env.Data == nil:
			t.Fatal("accepted an event without data")
		case len(bytes.TrimSpace(env.Data.Object)) == 0 || !json.Valid(env.Data.Object):
			t.Fatalf("accepted data.object %q", env.Data.Object)
		case len(env.Data.PreviousAttributes) > 0 && !json.Valid(env.Data.PreviousAttributes):
			t.Fatalf("accepted data.previous_attributes %q", env.Data.PreviousAttributes)
		}
		if !bytes.Equal(ev.Object, env.Data.Object) || !bytes.Equal(ev.PreviousAttributes, env.Data.PreviousAttributes) {
			t.Fatalf("decodeEvent's object %q differs from decodeEnvelope's %q", ev.Object, env.Data.Object)
		}
		if env.Created > maxCreated {
			t.Fatalf("accepted created %d, beyond what PostgreSQL stores", env.Created)
		}
		if env.Created > 0 && ev.Created.Unix() != env.Created || env.Created <= 0 && !ev.Created.IsZero() {
			t.Fatalf("created %d decoded as %s", env.Created, ev.Created)
		}
		_ = env.apiVersion()
	})
}

// decodeEnvelope is the reference reading of a body: encoding/json into envelope, then the
// inbox's checks. readEvent and decodeEvent must read every body as it does.
func decodeEnvelope(body []byte) (envelope, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return env, fmt.Errorf("body is not a JSON event: %w", err)
	}
	return env, checkEnvelope(env)
}

// checkReadEvent checks the receive path's reading of a verified body against decodeEnvelope's
// (env, err) and jsonkeys.Check: readEvent accepts exactly what both accept, with the same
// envelope, answers ambiguous_json for duplicate keys and invalid_event otherwise; and what it
// accepts, a reader of exact keys (as jsonb is) reads as decodeEnvelope does: the one key that
// folds to "id", "object", "type", "livemode" or "data" holds what decodeEnvelope read.
func checkReadEvent(t *testing.T, body []byte, env envelope, err error) {
	t.Helper()
	renv, code, rerr := readEvent(body)
	kerr := jsonkeys.Check(body)
	switch {
	case kerr != nil:
		want := apierr.CodeNotAnEvent
		if errors.Is(kerr, jsonkeys.ErrDuplicateKey) {
			want = apierr.CodeAmbiguousJSON
		}
		if rerr == nil || code != want {
			t.Fatalf("body %q: jsonkeys says %v, readEvent %q %v", body, kerr, code, rerr)
		}
		return
	case err != nil:
		if rerr == nil || code != apierr.CodeNotAnEvent {
			t.Fatalf("body %q: decodeEnvelope says %v, readEvent %q %v", body, err, code, rerr)
		}
		return
	case rerr != nil:
		t.Fatalf("body %q: readEvent refuses (%q %v) what decodeEnvelope and jsonkeys accept", body, code, rerr)
	}
	if !reflect.DeepEqual(renv, env) {
		t.Fatalf("body %q: readEvent's envelope %+v differs from decodeEnvelope's %+v", body, renv, env)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %q accepted, but not an object of exact keys: %v", body, err)
	}
	var object any
	if err := json.Unmarshal(env.Data.Object, &object); err != nil {
		t.Fatalf("data.object %q: %v", env.Data.Object, err)
	}
	data, _ := foldLookup(t, m, "data").(map[string]any)
	for k, want := range map[string]any{"id": env.ID, "object": env.Object, "type": env.Type, "livemode": *env.Livemode} {
		if got := foldLookup(t, m, k); got != want {
			t.Fatalf("body %q: %s is %v for an exact reader, %v for decodeEnvelope", body, k, got, want)
		}
	}
	if got := foldLookup(t, data, "object"); !reflect.DeepEqual(got, object) {
		t.Fatalf("body %q: data.object is %v for an exact reader, %v for decodeEnvelope", body, got, object)
	}
}

// foldLookup returns the value of the only key of m that equals k under case folding.
func foldLookup(t *testing.T, m map[string]any, k string) any {
	t.Helper()
	var found []string
	for key := range m {
		if strings.EqualFold(key, k) {
			found = append(found, key)
		}
	}
	if len(found) != 1 {
		t.Fatalf("keys %q fold to %q in an accepted body, want exactly one", found, k)
	}
	return m[found[0]]
}
