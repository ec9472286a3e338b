package devstripe

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// The small JSON and form helpers the dev Stripe shares with the emulator's, kept here so that
// stripeemu exports only what an emulator offers.

// decode decodes a kept object (JSON the dev Stripe wrote itself: an error is a bug).
func decode(raw []byte) map[string]any {
	if raw == nil {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		panic(fmt.Errorf("devstripe: %w", err))
	}
	return m
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// nullable is s, or JSON null when empty (as Stripe answers an unset field).
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// metadataOf is the metadata[…] parameters of a form.
func metadataOf(form url.Values) map[string]any {
	md := map[string]any{}
	for k, v := range form {
		if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") && len(v) > 0 {
			md[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	return md
}
