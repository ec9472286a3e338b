// Package auth checks the bearer tokens of the app backend and of admins. Tokens are compared in
// constant time, and a request with a valid token of the other role gets 403, not 401. Admin
// writes authenticated by Basic credentials (a browser's) also need a CSRF token (csrf.go).
//
// An admin token may carry a name ("alice:TOKEN" in auth.admin_tokens): the name is the actor of
// the admin's actions in the audit log. An unnamed token's actor is its fingerprint, never the
// token.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"net/url"
	"regexp"
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
	app   [][32]byte
	admin [][32]byte
	// actors[i] is who admin[i] authenticates: its name, or its fingerprint.
	actors []string
}

// tokenName is the shape of an admin token's name: "name:TOKEN" splits only on such a name, so a
// token that merely contains a colon stays whole.
var tokenName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// SplitAdminToken splits an auth.admin_tokens entry "name:TOKEN" into its name and token; an entry
// without a name (or whose part before the first colon is no name) is all token, name "".
func SplitAdminToken(entry string) (name, token string) {
	if n, tok, ok := strings.Cut(entry, ":"); ok && tokenName.MatchString(n) && tok != "" {
		return n, tok
	}
	return "", entry
}

// Fingerprint names a token without revealing it: "token:" and the first 12 hex digits of its
// SHA-256 (a third of a 32-character token's entropy would still be out of reach).
func Fingerprint(token string) string {
	d := sha256.Sum256([]byte(token))
	return "token:" + hex.EncodeToString(d[:6])
}

// New keeps only digests of the tokens: comparing fixed-length digests in constant time hides
// both the content and the length of the configured tokens. Admin entries may be "name:TOKEN".
func New(appTokens, adminTokens []string) *Tokens {
	t := &Tokens{}
	for _, s := range appTokens {
		if s != "" {
			t.app = append(t.app, sha256.Sum256([]byte(s)))
		}
	}
	for _, s := range adminTokens {
		if s == "" {
			continue
		}
		name, token := SplitAdminToken(s)
		if name == "" {
			t.admin = append(t.admin, sha256.Sum256([]byte(token)))
			t.actors = append(t.actors, Fingerprint(token))
			continue
		}
		t.admin = append(t.admin, sha256.Sum256([]byte(token)))
		t.actors = append(t.actors, name)
		// A deployment whose unnamed token happened to look like "name:…" keeps working: the
		// whole entry authenticates too, as the same actor.
		t.admin = append(t.admin, sha256.Sum256([]byte(s)))
		t.actors = append(t.actors, name)
	}
	return t
}

// matchIndex is the index of d in list, -1 when absent.
func matchIndex(list [][32]byte, d [32]byte) int {
	found := -1
	for i, want := range list {
		// No early exit: the time taken does not depend on which token matched.
		if subtle.ConstantTimeCompare(want[:], d[:]) == 1 {
			found = i
		}
	}
	return found
}

// RoleOf returns the role of a presented token.
func (t *Tokens) RoleOf(token string) Role {
	role, _ := t.identify(token)
	return role
}

// identify is the role of a token and, for an admin token, its actor.
func (t *Tokens) identify(token string) (Role, string) {
	if token == "" {
		return RoleNone, ""
	}
	d := sha256.Sum256([]byte(token))
	if i := matchIndex(t.admin, d); i >= 0 {
		return RoleAdmin, t.actors[i]
	}
	if matchIndex(t.app, d) >= 0 {
		return RoleApp, ""
	}
	return RoleNone, ""
}

type actorKey struct{}

// Actor is who made an admin request: its token's name or fingerprint; "" outside an admin
// request (a command, a periodic job).
func Actor(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	return a
}

// WithActor returns ctx carrying actor, as Require leaves it on admin requests.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
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
			role, actor := t.identify(token)
			switch role {
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
				if actor != "" {
					c.SetRequest(c.Request().WithContext(WithActor(c.Request().Context(), actor)))
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
