package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// Cross-site request forgery. A browser re-sends Basic credentials with any request to this host,
// so a form that another site makes the admin's browser submit would carry them. The cross-site
// check (Sec-Fetch-Site, Origin) refuses most of those, but older browsers and proxies may strip
// those headers; every write authenticated by Basic credentials must therefore also carry a token
// that only a page of this console can know.
//
// The token needs no server-side session and works across replicas: it is an HMAC, keyed with
// the admin token that authenticated the page, of the moment it was issued. Only a holder of the
// admin token can make one; a leaked token expires after CSRFLifetime and reveals nothing about
// the admin token. Bearer-authenticated requests need none: a browser never adds an
// Authorization: Bearer header on its own, so another site cannot forge one.

const (
	// CSRFField is the hidden form field that carries the token.
	CSRFField = "csrf_token"
	// CSRFHeader carries it for scripted clients that use Basic credentials.
	CSRFHeader = "X-CSRF-Token"
	// CSRFLifetime is how long a token (a page left open) stays valid.
	CSRFLifetime = 12 * time.Hour
	// csrfSkew tolerates clocks of replicas that disagree a little.
	csrfSkew = time.Minute
)

// credentialKey is where Require leaves the token that authenticated the request.
const credentialKey = "auth.credential"

// CSRFToken returns a token for the forms of the page being rendered, or "" when the request was
// not authenticated by a Require that takes Basic credentials (the pages' groups).
func CSRFToken(c echo.Context) string {
	cred, _ := c.Get(credentialKey).(string)
	if cred == "" {
		return ""
	}
	return csrfToken(cred, time.Now())
}

func csrfToken(credential string, issued time.Time) string {
	ts := strconv.FormatInt(issued.Unix(), 10)
	return ts + "." + csrfMAC(credential, ts)
}

func csrfMAC(credential, ts string) string {
	m := hmac.New(sha256.New, []byte(credential))
	m.Write([]byte("billing admin csrf\x00" + ts))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// csrfValid reports whether token was issued for credential less than CSRFLifetime before now.
func csrfValid(credential, token string, now time.Time) bool {
	ts, mac, ok := strings.Cut(token, ".")
	if !ok || ts == "" || mac == "" {
		return false
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false
	}
	issued := time.Unix(sec, 0)
	if now.Sub(issued) > CSRFLifetime || issued.Sub(now) > csrfSkew {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(csrfMAC(credential, ts)))
}

// submittedCSRF is the token of a write: the header, else the field of a form body (other bodies
// are left unread). Never the query string: a token in a URL leaks through logs, history and
// Referer.
func submittedCSRF(c echo.Context) string {
	if h := c.Request().Header.Get(CSRFHeader); h != "" {
		return h
	}
	r := c.Request()
	if err := r.ParseForm(); err != nil {
		return ""
	}
	return r.PostForm.Get(CSRFField)
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}
