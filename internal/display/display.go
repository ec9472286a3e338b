// Package display formats values for people: the customer notices and the admin page show
// dates, amounts and links the same way.
package display

import (
	"strconv"
	"strings"
	"time"
)

// SafeURL keeps only http(s) links (html/template would neuter others; plain text must too).
func SafeURL(u string) string {
	if strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") {
		return u
	}
	return ""
}

// Date renders a day, "June 4, 2024" (UTC); "" for nil.
func Date(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format("January 2, 2006")
}

// Time renders a moment to the minute, "June 4, 2024 15:04 UTC"; "" for nil.
func Time(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format("January 2, 2006 15:04 MST")
}

// Currencies whose Stripe amounts are not in hundredths (https://docs.stripe.com/currencies).
var (
	zeroDecimal = map[string]bool{
		"bif": true, "clp": true, "djf": true, "gnf": true, "jpy": true, "kmf": true, "krw": true,
		"mga": true, "pyg": true, "rwf": true, "ugx": true, "vnd": true, "vuv": true, "xaf": true,
		"xof": true, "xpf": true,
	}
	threeDecimal = map[string]bool{"bhd": true, "jod": true, "kwd": true, "omr": true, "tnd": true}
)

// Amount renders Stripe's minor units as "12.34 USD"; "" when unknown.
func Amount(amount *int64, currency string) string {
	if amount == nil {
		return ""
	}
	cur := strings.ToLower(currency)
	decimals := 2
	switch {
	case zeroDecimal[cur]:
		decimals = 0
	case threeDecimal[cur]:
		decimals = 3
	}
	v := *amount
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	s := strconv.FormatInt(v, 10)
	if decimals > 0 {
		if len(s) <= decimals {
			s = strings.Repeat("0", decimals-len(s)+1) + s
		}
		s = s[:len(s)-decimals] + "." + s[len(s)-decimals:]
	}
	out := sign + s
	if cur != "" {
		out += " " + strings.ToUpper(cur)
	}
	return out
}
