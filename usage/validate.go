package usage

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"time"

	"billing/internal/apierr"
	"billing/internal/ids"
)

// Stripe's limits on a meter event.
const (
	// maxIdentifierLen is Stripe's limit on identifier (and event_name).
	maxIdentifierLen = 100
	// MaxValue is the largest value accepted: the largest integer every JSON reader holds
	// exactly (2^53-1).
	MaxValue = 1<<53 - 1
	// maxAge and maxAhead are how far from now Stripe takes a timestamp.
	maxAge   = 35 * 24 * time.Hour
	maxAhead = 5 * time.Minute
)

// meterPattern is the shape of a meter's event_name accepted here: what Stripe takes (at most
// 100 characters) narrowed to the characters that need no escaping in logs, metrics and URLs.
var meterPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$`)

type usageRequestJSON struct {
	UsageID   json.RawMessage `json:"usage_id"`
	Meter     json.RawMessage `json:"meter"`
	Value     json.RawMessage `json:"value"`
	Timestamp json.RawMessage `json:"timestamp"`
}

// usageRequest is a validated POST body. Timestamp is nil when the body left it out (now).
type usageRequest struct {
	UsageID   string
	Meter     string
	Value     int64
	Timestamp *time.Time
}

func absent(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// parseRequest checks the body's shape for userID: everything but what depends on the clock
// and the database (the timestamp's range, the customer).
func parseRequest(raw usageRequestJSON, userID string) (usageRequest, error) {
	var req usageRequest
	var err error
	if req.UsageID, err = stringField(raw.UsageID, "usage_id", apierr.CodeInvalidUsageID); err != nil {
		return req, err
	}
	if err := ids.Check(req.UsageID, "usage_id", apierr.CodeInvalidUsageID); err != nil {
		return req, err
	}
	if n := len(Identifier(userID, req.UsageID)); n > maxIdentifierLen {
		return req, apierr.New(apierr.CodeInvalidUsageID,
			"usage_id is too long for this user: the meter event identifier usage-{user_id}-{usage_id} must be at most %d characters (it would be %d)",
			maxIdentifierLen, n)
	}
	if req.Meter, err = meterField(raw.Meter); err != nil {
		return req, err
	}
	if req.Value, err = valueField(raw.Value); err != nil {
		return req, err
	}
	if req.Timestamp, err = timestampField(raw.Timestamp); err != nil {
		return req, err
	}
	return req, nil
}

// stringField decodes a required JSON string.
func stringField(raw json.RawMessage, name string, code apierr.Code) (string, error) {
	if absent(raw) {
		return "", apierr.New(code, "%s is required", name)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", apierr.New(code, "%s must be a string", name)
	}
	if s == "" {
		return "", apierr.New(code, "%s is required", name)
	}
	return s, nil
}

func meterField(raw json.RawMessage) (string, error) {
	s, err := stringField(raw, "meter", apierr.CodeInvalidMeter)
	if err != nil {
		return "", err
	}
	return s, checkMeter(s)
}

// checkMeter validates a meter's event name.
func checkMeter(s string) error {
	if !meterPattern.MatchString(s) {
		return apierr.New(apierr.CodeInvalidMeter,
			"meter must be the event name of a Stripe meter: 1 to 100 characters of A-Z, a-z, 0-9, _ . : and -, starting with a letter or digit")
	}
	return nil
}

// valueField decodes the value: a JSON integer from 0 to MaxValue. Strings, fractions and
// exponents (1.5, 1.0, 1e3) are refused rather than rounded: Stripe's meters sum integers, and
// a client sending fractions must learn it before anything is stored.
func valueField(raw json.RawMessage) (int64, error) {
	if absent(raw) {
		return 0, apierr.New(apierr.CodeInvalidValue, "value is required")
	}
	t := string(bytes.TrimSpace(raw))
	switch {
	case t[0] == '"':
		return 0, apierr.New(apierr.CodeInvalidValue, "value must be a JSON integer, not a string")
	case t[0] != '-' && (t[0] < '0' || t[0] > '9'):
		return 0, apierr.New(apierr.CodeInvalidValue, "value must be a JSON integer")
	case strings.ContainsAny(t, ".eE"):
		return 0, apierr.New(apierr.CodeInvalidValue, "value must be an integer, without fraction or exponent")
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n > MaxValue {
		return 0, apierr.New(apierr.CodeInvalidValue, "value must be at most %d", int64(MaxValue))
	}
	if n < 0 {
		return 0, apierr.New(apierr.CodeInvalidValue,
			"value must not be negative (usage already reported is corrected at Stripe, with a meter event adjustment)")
	}
	return n, nil
}

// timestampField decodes the optional timestamp: an RFC 3339 string or Unix seconds, kept to
// the second (Stripe's precision).
func timestampField(raw json.RawMessage) (*time.Time, error) {
	if absent(raw) {
		return nil, nil
	}
	t := string(bytes.TrimSpace(raw))
	var at time.Time
	if t[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, apierr.New(apierr.CodeInvalidTimestamp, "timestamp must be an RFC 3339 string or Unix seconds")
		}
		p, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return nil, apierr.New(apierr.CodeInvalidTimestamp, "timestamp must be an RFC 3339 time such as 2024-06-20T12:00:00Z, or Unix seconds")
		}
		at = p
	} else {
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil {
			return nil, apierr.New(apierr.CodeInvalidTimestamp, "timestamp must be an RFC 3339 string or whole Unix seconds")
		}
		at = time.Unix(n, 0)
	}
	at = at.Truncate(time.Second).UTC()
	return &at, nil
}

// checkTimestamp refuses what Stripe would refuse: older than 35 days or more than 5 minutes
// ahead of now.
func checkTimestamp(at, now time.Time) error {
	if at.Before(now.Add(-maxAge)) {
		return apierr.New(apierr.CodeInvalidTimestamp,
			"timestamp %s is older than 35 days: Stripe takes no usage that old", at.Format(time.RFC3339)).
			With("timestamp", at.Format(time.RFC3339))
	}
	if at.After(now.Add(maxAhead)) {
		return apierr.New(apierr.CodeInvalidTimestamp,
			"timestamp %s is more than 5 minutes ahead of the service's clock", at.Format(time.RFC3339)).
			With("timestamp", at.Format(time.RFC3339))
	}
	return nil
}
