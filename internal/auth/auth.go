// Package auth checks the bearer tokens of the app backend and of admins. Tokens are compared in
// constant time, and a request with a valid token of the other role gets 403, not 401. Admin
// writes authenticated by Basic credentials (a browser's) also need a CSRF token (csrf.go).
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
)

// Role is who a token belongs to.
type Role int

const (
	RoleNone Role = iota
	RoleApp
	RoleAdmin
)

// Tokens knows both roles' tokens.
type Tokens struct {
	app, admin [][32]byte
}

// New keeps only digests of the tokens: comparing fixed-length digests in constant time hides
// both the content and the length of the configured tokens.
func New(appTokens, adminTokens []string) *Tokens {
	t := &Tokens{}
	for _, s := range appTokens {
		if s != "" {
			t.app = append(t.app, sha256.Sum256([]byte(s)))
		}
	}
	for _, s := range adminTokens {
		if s != "" {
			t.admin = append(t.admin, sha256.Sum256([]byte(s)))
		}
	}
	return t
}

func match(list [][32]byte, d [32]byte) bool {
	found := 0
	for _, want := range list {
		// No early exit: the time taken does not depend on which token matched.
		found |= subtle.ConstantTimeCompare(want[:], d[:])
	}
	return found == 1
}

// RoleOf returns the role of a presented token.
func (t *Tokens) RoleOf(token string) Role {
	if token == "" {
		return RoleNone
	}
	d := sha256.Sum256([]byte(token))
	switch {
	case match(t.admin, d):
		return RoleAdmin
	case match(t.app, d):
		return RoleApp
	}
	return RoleNone
}

// crossSite reports whether a browser says the request comes from another site.
func crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return true
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return true
		}
	}
	return false
}

func bearer(c echo.Context) string {
	h := c.Request().Header.Get(echo.HeaderAuthorization)
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// Require returns middleware that lets through only requests with a token of role want.
// allowBasic also accepts the token as the HTTP Basic password (for admin pages in a browser).
func (t *Tokens) Require(want Role, allowBasic bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			token := bearer(c)
			basic := false
			if token == "" && allowBasic {
				if _, pw, ok := c.Request().BasicAuth(); ok {
					// A browser re-sends Basic credentials on any request to this host, including
					// one forged by another site's form: refuse cross-site writes.
					if !safeMethod(c.Request().Method) && crossSite(c.Request()) {
						return apierr.New(apierr.CodeForbidden, "cross-site request refused")
					}
					token, basic = pw, true
				}
			}
			switch t.RoleOf(token) {
			case want:
				// The check follows the role's: a token that does not authenticate gets 401 first.
				if basic && !safeMethod(c.Request().Method) && !csrfValid(token, submittedCSRF(c), time.Now()) {
					return apierr.New(apierr.CodeForbidden, "missing or expired CSRF token: reload the page and submit the form again")
				}
				// Only the pages of a group that takes Basic credentials make CSRF tokens; the app's
				// API skips the context's store, an allocation per request.
				if allowBasic {
					c.Set(credentialKey, token)
				}
				return next(c)
			case RoleNone:
				if allowBasic {
					c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Basic realm="billing admin"`)
				} else {
					c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="billing"`)
				}
				if token == "" {
					return apierr.New(apierr.CodeUnauthorized, "missing bearer token")
				}
				return apierr.New(apierr.CodeUnauthorized, "invalid bearer token")
			default:
				return apierr.New(apierr.CodeForbidden, "this token may not use this endpoint")
			}
		}
	}
}
