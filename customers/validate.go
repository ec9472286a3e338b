package customers

import (
	"net/mail"
	"strings"
	"unicode"
	"unicode/utf8"

	"billing/internal/apierr"
)

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
