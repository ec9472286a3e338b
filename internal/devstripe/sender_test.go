package devstripe

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"billing/internal/stripeevents"
)

// Events go out in order, each signed with the secret, and a delivery answered other than 200 is
// tried again until it is; one that never is stops the sending, so nothing overtakes it.
func TestWebhookSenderRetriesInOrderAndSigns(t *testing.T) {
	const secret = "whsec_sender_test"
	var mu sync.Mutex
	var got []string
	refuse := map[string]int{"evt_2": 2, "evt_4": 1000}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev struct{ ID string }
		_ = json.Unmarshal(body, &ev)
		sig := r.Header.Get("Stripe-Signature")
		ts, _, _ := strings.Cut(strings.TrimPrefix(sig, "t="), ",")
		n, _ := strconv.ParseInt(ts, 10, 64)
		if sig != stripeevents.SignatureHeader(body, secret, time.Unix(n, 0)) || time.Since(time.Unix(n, 0)) > time.Minute {
			http.Error(w, "bad signature", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, ev.ID)
		if refuse[ev.ID] > 0 {
			refuse[ev.ID]--
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
	}))
	defer srv.Close()
	s := &WebhookSender{URL: srv.URL, Secret: secret, Backoff: time.Millisecond}
	ev := func(id string) []byte {
		return stripeevents.Event(id, "invoice.paid", time.Now(), false, map[string]any{"id": "in_1", "object": "invoice"}, nil)
	}
	ds, err := s.Send(context.Background(), ev("evt_1"), ev("evt_2"), ev("evt_3"))
	if err != nil || len(ds) != 3 || ds[1].Attempts != 3 || ds[1].Status != http.StatusOK {
		t.Fatalf("deliveries %+v, %v", ds, err)
	}
	if strings.Join(got, " ") != "evt_1 evt_2 evt_2 evt_2 evt_3" {
		t.Errorf("received %v", got)
	}
	got = nil
	ds, err = s.Send(context.Background(), ev("evt_4"), ev("evt_5"))
	if err == nil || len(ds) != 1 || ds[0].Attempts != 5 || ds[0].Status != http.StatusServiceUnavailable {
		t.Fatalf("never accepted: %+v, %v", ds, err)
	}
	if strings.Contains(strings.Join(got, " "), "evt_5") {
		t.Errorf("an event overtook one not delivered: %v", got)
	}
}
