package httpserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
)

// MaxJSONBody caps request bodies of the JSON API.
const MaxJSONBody = 1 << 20

// DecodeJSON reads a JSON request body into v, strictly: unknown fields and trailing data are
// errors, so that a typo in a field name is a 400 and not a silently ignored value. An empty
// body decodes as {} when allowEmpty.
func DecodeJSON(c echo.Context, v any, allowEmpty bool) error {
	body := http.MaxBytesReader(c.Response(), c.Request().Body, MaxJSONBody)
	data, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return apierr.New(apierr.CodeBodyTooLarge, "request body exceeds %d bytes", MaxJSONBody)
		}
		return apierr.Wrap(err, apierr.CodeInvalidRequest, "could not read request body")
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		if allowEmpty {
			return nil
		}
		return apierr.New(apierr.CodeInvalidJSON, "request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apierr.Wrap(err, apierr.CodeInvalidJSON, "request body is not valid JSON for this endpoint: %s", jsonProblem(err))
	}
	// Only whitespace may follow the value. dec.More() is not enough: it is false for a stray
	// '}' or ']', so `{"a":1}}` would pass.
	var rest json.RawMessage
	if err := dec.Decode(&rest); !errors.Is(err, io.EOF) {
		return apierr.New(apierr.CodeInvalidJSON, "request body has data after the JSON object")
	}
	return nil
}

func jsonProblem(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return "syntax error"
	case errors.As(err, &te):
		return "field " + te.Field + " has the wrong type"
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ")
	}
	return "malformed JSON"
}
