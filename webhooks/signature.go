package webhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Signature verification errors, each answered with its own 400 code.
var (
	ErrNoSignature        = errors.New("no Stripe-Signature header")
	ErrMalformedSignature = errors.New("malformed Stripe-Signature header")
	ErrBadSignature       = errors.New("no signature matches any configured secret")
	ErrStaleTimestamp     = errors.New("signature timestamp outside the tolerance")
)

// maxSignatures bounds the work one request can ask for: Stripe sends one v1 per active secret.
const maxSignatures = 16

type signatureHeader struct {
	timestamp  int64
	signatures [][]byte
}

// parseSignatureHeader parses `t=<unix>,v1=<hex>[,v1=<hex>…]`; other schemes (v0) are ignored,
// as Stripe documents.
func parseSignatureHeader(h string) (signatureHeader, error) {
	var out signatureHeader
	if strings.TrimSpace(h) == "" {
		return out, ErrNoSignature
	}
	haveT := false
	for _, part := range strings.Split(h, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return out, ErrMalformedSignature
		}
		switch k {
		case "t":
			ts, err := strconv.ParseInt(v, 10, 64)
			if err != nil || ts <= 0 {
				return out, ErrMalformedSignature
			}
			out.timestamp, haveT = ts, true
		case "v1":
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				// A v1 that is not a SHA-256 in hex can never match: say so rather than "no match".
				return out, ErrMalformedSignature
			}
			if len(out.signatures) < maxSignatures {
				out.signatures = append(out.signatures, sig)
			}
		}
	}
	if !haveT || len(out.signatures) == 0 {
		return out, ErrMalformedSignature
	}
	return out, nil
}

// Modes is the set of modes whose secrets verified a signature.
type Modes uint8

// The modes of Modes.
const (
	ModeTest Modes = 1 << iota
	ModeLive
)

// Has reports whether the secrets of the mode livemode names are among m.
func (m Modes) Has(livemode bool) bool {
	if livemode {
		return m&ModeLive != 0
	}
	return m&ModeTest != 0
}

// VerifySignature checks header against payload with any of secrets: an HMAC-SHA256 of
// "<t>.<payload>" compared in constant time, and t within tolerance of now (either side, so a
// forged future timestamp cannot extend a replay window).
func VerifySignature(payload []byte, header string, secrets []string, tolerance time.Duration, now time.Time) error {
	_, err := VerifySignatureModes(payload, header, secrets, nil, tolerance, now)
	return err
}

// VerifySignatureModes is VerifySignature with the secrets of both modes: it tries every secret
// of both, before anything reads the payload, and on success returns the modes whose secrets
// match one of the header's signatures. Only the payload's own mode may then be trusted: a
// caller must check that the payload's livemode is among them. The errors do not say which modes
// have secrets.
func VerifySignatureModes(payload []byte, header string, testSecrets, liveSecrets []string, tolerance time.Duration, now time.Time) (Modes, error) {
	h, err := parseSignatureHeader(header)
	if err != nil {
		return 0, err
	}
	var matched Modes
	for _, set := range [...]struct {
		mode    Modes
		secrets []string
	}{{ModeTest, testSecrets}, {ModeLive, liveSecrets}} {
		for _, secret := range set.secrets {
			if h.matches(payload, secret) {
				matched |= set.mode
			}
		}
	}
	if matched == 0 {
		return 0, ErrBadSignature
	}
	// The age is checked after the HMAC so that an unsigned request learns nothing about timing.
	age := now.Sub(time.Unix(h.timestamp, 0))
	if age > tolerance || age < -tolerance {
		return 0, ErrStaleTimestamp
	}
	return matched, nil
}

// matches reports whether one of h's signatures is the HMAC of "<t>.<payload>" under secret.
// Every signature is compared, in constant time, whatever the earlier ones gave.
func (h signatureHeader) matches(payload []byte, secret string) bool {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(strconv.FormatInt(h.timestamp, 10)))
	mac.Write([]byte("."))
	mac.Write(payload)
	expected := mac.Sum(nil)
	matched := false
	for _, sig := range h.signatures {
		if hmac.Equal(expected, sig) {
			matched = true
		}
	}
	return matched
}
