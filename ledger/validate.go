package ledger

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"billing/internal/apierr"
	"billing/internal/ids"
)

// MaxAmount is Stripe's largest amount in minor units (eight digits).
const MaxAmount = 99_999_999

// maxDescriptionLen is Stripe's limit for a PaymentIntent description.
const maxDescriptionLen = 1000

// refundReasons are the reasons Stripe accepts for a refund.
var refundReasons = map[string]bool{"duplicate": true, "fraudulent": true, "requested_by_customer": true}

// currencies are the ISO 4217 codes Stripe accepts for charges (its list of presentment
// currencies), lower case as Stripe wants them.
var currencies = func() map[string]bool {
	const list = "usd aed afn all amd ang aoa ars aud awg azn bam bbd bdt bgn bhd bif bmd bnd bob brl bsd bwp byn bzd " +
		"cad cdf chf clp cny cop crc cve czk djf dkk dop dzd egp etb eur fjd fkp gbp gel gip gmd gnf gtq gyd " +
		"hkd hnl htg huf idr ils inr isk jmd jod jpy kes kgs khr kmf krw kwd kyd kzt lak lbp lkr lrd lsl mad mdl " +
		"mga mkd mmk mnt mop mur mvr mwk mxn myr mzn nad ngn nio nok npr nzd omr pab pen pgk php pkr pln pyg qar " +
		"ron rsd rub rwf sar sbd scr sek sgd shp sle sll sos srd std szl thb tjs tnd top try ttd twd tzs uah ugx " +
		"uyu uzs vnd vuv wst xaf xcd xof xpf yer zar zmw"
	m := map[string]bool{}
	for _, c := range strings.Fields(list) {
		m[c] = true
	}
	return m
}()

// absent reports whether a JSON field was left out or null.
func absent(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// stringField decodes a JSON string field; any other JSON type is a 400 with code.
func stringField(raw json.RawMessage, name string, code apierr.Code) (string, bool, error) {
	if absent(raw) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, apierr.New(code, "%s must be a string", name)
	}
	return s, true, nil
}

// idField decodes a required identifier ([A-Za-z0-9_-]{1,100}).
func idField(raw json.RawMessage, name string, code apierr.Code) (string, error) {
	s, ok, err := stringField(raw, name, code)
	if err != nil {
		return "", err
	}
	if !ok || s == "" {
		return "", apierr.New(code, "%s is required", name)
	}
	return s, checkID(s, name, code)
}

func checkID(s, name string, code apierr.Code) error { return ids.Check(s, name, code) }

// amountField decodes an amount in minor units: a JSON integer from 1 to MaxAmount. Strings,
// fractions and exponents (100.0, 1e2) are refused rather than converted, so that a client
// sending major units by mistake learns it.
func amountField(raw json.RawMessage) (int64, bool, error) {
	if absent(raw) {
		return 0, false, nil
	}
	t := string(bytes.TrimSpace(raw))
	switch {
	case t[0] == '"':
		return 0, false, apierr.New(apierr.CodeInvalidAmount, "amount must be a JSON integer in minor units, not a string")
	case t[0] != '-' && (t[0] < '0' || t[0] > '9'):
		return 0, false, apierr.New(apierr.CodeInvalidAmount, "amount must be a JSON integer in minor units")
	case strings.ContainsAny(t, ".eE"):
		return 0, false, apierr.New(apierr.CodeInvalidAmount, "amount must be an integer in minor units, without fraction or exponent")
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0, false, apierr.New(apierr.CodeInvalidAmount, "amount must be at most %d", MaxAmount)
	}
	if n <= 0 {
		return 0, false, apierr.New(apierr.CodeInvalidAmount, "amount must be positive")
	}
	if n > MaxAmount {
		return 0, false, apierr.New(apierr.CodeInvalidAmount, "amount must be at most %d", MaxAmount)
	}
	return n, true, nil
}

// currencyField decodes a Stripe-supported ISO 4217 code and lower-cases it.
func currencyField(raw json.RawMessage) (string, error) {
	s, ok, err := stringField(raw, "currency", apierr.CodeInvalidCurrency)
	if err != nil {
		return "", err
	}
	if !ok || s == "" {
		return "", apierr.New(apierr.CodeInvalidCurrency, "currency is required")
	}
	c := strings.ToLower(s)
	if len(c) != 3 || !currencies[c] {
		return "", apierr.New(apierr.CodeInvalidCurrency, "currency must be a three-letter ISO 4217 code that Stripe supports")
	}
	return c, nil
}

// descriptionField decodes the optional description; empty counts as absent.
func descriptionField(raw json.RawMessage) (*string, error) {
	s, ok, err := stringField(raw, "description", apierr.CodeInvalidDescription)
	if err != nil || !ok || s == "" {
		return nil, err
	}
	if !utf8.ValidString(s) || utf8.RuneCountInString(s) > maxDescriptionLen {
		return nil, apierr.New(apierr.CodeInvalidDescription, "description must be valid UTF-8 of at most %d characters", maxDescriptionLen)
	}
	for _, r := range s {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return nil, apierr.New(apierr.CodeInvalidDescription, "description must not contain control characters")
		}
	}
	return &s, nil
}

// reasonField decodes the optional refund reason.
func reasonField(raw json.RawMessage) (*string, error) {
	s, ok, err := stringField(raw, "reason", apierr.CodeInvalidRefundReason)
	if err != nil || !ok {
		return nil, err
	}
	if !refundReasons[s] {
		return nil, apierr.New(apierr.CodeInvalidRefundReason, "reason must be one of duplicate, fraudulent, requested_by_customer")
	}
	return &s, nil
}
