package outbound

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/labstack/echo/v4"
	"net/http"

	"billing/internal/apierr"
)

// The answer a caller stores with its completed row: exactly one of a success body and an
// *apierr.Error (a final refusal, e.g. a decline). The first answer and every replay are rendered
// from it, so a repeat of the request gets the same JSON, also after Stripe's key window.

type storedAnswer struct {
	Body  json.RawMessage `json:"body,omitempty"`
	Error *storedError    `json:"error,omitempty"`
}

type storedError struct {
	Code    apierr.Code    `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// EncodeAnswer is the stored form of an outcome: body on success, apiErr for a final refusal.
func EncodeAnswer(body any, apiErr *apierr.Error) (string, error) {
	var a storedAnswer
	if apiErr != nil {
		a.Error = &storedError{Code: apiErr.Code, Message: apiErr.Message, Details: apiErr.Details}
	} else {
		b, err := json.Marshal(body)
		if err != nil {
			return "", fmt.Errorf("encode answer body: %w", err)
		}
		a.Body = b
	}
	b, err := json.Marshal(a)
	if err != nil {
		return "", fmt.Errorf("encode answer: %w", err)
	}
	return string(b), nil
}

// DecodeAnswer renders a stored answer: the success body, decoded into body (a pointer to the
// endpoint's answer struct) and encoded again so that every replay has the same bytes whatever
// jsonb did to key order and spacing; or the stored refusal as an *apierr.Error.
func DecodeAnswer(raw *string, body any) (json.RawMessage, error) {
	if raw == nil {
		return nil, apierr.Internal(errors.New("completed row without an answer"))
	}
	var a storedAnswer
	if err := json.Unmarshal([]byte(*raw), &a); err != nil {
		return nil, apierr.Internal(fmt.Errorf("decode stored answer: %w", err))
	}
	if a.Error != nil {
		e := apierr.New(a.Error.Code, "%s", a.Error.Message)
		for k, v := range a.Error.Details {
			e = e.With(k, v)
		}
		return nil, e
	}
	if err := json.Unmarshal(a.Body, body); err != nil {
		return nil, apierr.Internal(fmt.Errorf("decode stored answer body: %w", err))
	}
	out, err := json.Marshal(body)
	if err != nil {
		return nil, apierr.Internal(fmt.Errorf("encode answer body: %w", err))
	}
	return out, nil
}

// Reply is what an endpoint of the protocol answers: a success body (201 when this request
// completed the row, 200 for a replay of its stored answer) or an *apierr.Error.
type Reply struct {
	Created bool
	Body    json.RawMessage
	Err     error
}

// Write sends the reply.
func (r Reply) Write(c echo.Context) error {
	if r.Err != nil {
		return r.Err
	}
	status := http.StatusOK
	if r.Created {
		status = http.StatusCreated
	}
	return c.JSONBlob(status, r.Body)
}

// ReplyOf renders the stored answer of a completed row (DecodeAnswer into body).
func ReplyOf(raw *string, body any, created bool) Reply {
	out, err := DecodeAnswer(raw, body)
	if err != nil {
		return Reply{Err: err}
	}
	return Reply{Created: created, Body: out}
}
