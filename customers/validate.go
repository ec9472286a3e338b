package customers

import (
	"net/mail"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"billing/internal/apierr"
)

// idPattern is the shape of every identifier the app backend gives us (user, order, refund and
// subscription ids): safe in URLs, in Stripe search queries and in idempotency keys.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,100}$`)

// ValidID reports whether s has the shape of an identifier of the API ([A-Za-z0-9_-]{1,100}).
func ValidID(s string) bool { return idPattern.MatchString(s) }

// CheckUserID returns a 400 invalid_user_id unless id is a valid user id.
func CheckUserID(id string) error {
	if !ValidID(id) {
		return apierr.New(apierr.CodeInvalidUserID, "user_id must be 1 to 100 characters of A-Z, a-z, 0-9, _ and -")
	}
	return nil
}

// Stripe's limits for customer fields.
const (
	maxEmailLen = 512
	maxNameLen  = 256
)

func checkEmail(email string) error {
	if email == "" {
		return apierr.New(apierr.CodeInvalidEmail, "email is required")
	}
	if len(email) > maxEmailLen {
		return apierr.New(apierr.CodeInvalidEmail, "email must be at most %d characters", maxEmailLen)
	}
	addr, err := mail.ParseAddress(email)
	// A bare address only: "Name <a@b>" parses too, but is not an email address.
	if err != nil || addr.Name != "" || addr.Address != email {
		return apierr.New(apierr.CodeInvalidEmail, "email is not a valid email address")
	}
	at := strings.LastIndexByte(email, '@')
	if at < 1 || !strings.Contains(email[at+1:], ".") || strings.HasPrefix(email[at+1:], "[") {
		return apierr.New(apierr.CodeInvalidEmail, "email must have a domain name after @")
	}
	return nil
}

func checkName(name string) error {
	if !utf8.ValidString(name) || utf8.RuneCountInString(name) > maxNameLen {
		return apierr.New(apierr.CodeInvalidName, "name must be valid UTF-8 of at most %d characters", maxNameLen)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return apierr.New(apierr.CodeInvalidName, "name must not contain control characters")
		}
	}
	return nil
}
