package httpserver

import (
	"crypto/rand"
	"encoding/hex"

	"github.com/labstack/echo/v4"
)

// maxRequestIDLen bounds a client-sent request id: it is echoed back and written to every log
// line of the request.
const maxRequestIDLen = 64

// requestID keeps a client's X-Request-Id when it is a short, safe token (so that a caller can
// follow its request through our logs) and replaces anything else with a new id.
func requestID() echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			rid := c.Request().Header.Get(echo.HeaderXRequestID)
			if !validRequestID(rid) {
				rid = newRequestID()
			}
			// Downstream code reading the request's header sees the accepted id too. Both headers
			// share one value slice (canonical key, as Set would write it): one allocation, not two.
			v := []string{rid}
			c.Request().Header[echo.HeaderXRequestID] = v
			c.Response().Header()[echo.HeaderXRequestID] = v
			return next(c)
		}
	}
}

// validRequestID accepts 1 to maxRequestIDLen characters of [A-Za-z0-9._-].
func validRequestID(s string) bool {
	if len(s) == 0 || len(s) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '.', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
