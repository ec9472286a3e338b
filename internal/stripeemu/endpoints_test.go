package stripeemu

import (
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"billing/internal/stripeclient"
)

func endpointsClient(t *testing.T) (*Proxy, *client.API) {
	t.Helper()
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("%s %s reached the upstream", r.Method, r.URL.Path)
		writeJSON(w, http.StatusNotFound, map[string]any{})
	})
	p := New(t, newTestServer(t, upstream))
	return p, stripeclient.New(p.URL, "sk_test_endpoints", slog.New(slog.DiscardHandler))
}

// The list pages newest first through stripe-go's iterator; a create answers the secret once;
// retrieve, update and delete act on what was created; the API version is fixed at creation.
func TestWebhookEndpointsAreStateful(t *testing.T) {
	p, sc := endpointsClient(t)
	eps := p.WebhookEndpoints()
	for i := range 23 {
		eps.Add("https://other.example/"+string(rune('a'+i)), "")
	}

	created, err := sc.WebhookEndpoints.New(&stripe.WebhookEndpointParams{
		URL:           stripe.String("https://billing.example/webhooks/stripe"),
		APIVersion:    stripe.String("2024-06-20"),
		EnabledEvents: stripe.StringSlice([]string{"invoice.paid", "customer.subscription.updated"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(created.Secret, "whsec_") || created.Status != "enabled" || created.APIVersion != "2024-06-20" ||
		!slices.Equal(created.EnabledEvents, []string{"invoice.paid", "customer.subscription.updated"}) {
		t.Fatalf("created %+v", created)
	}

	var listed []*stripe.WebhookEndpoint
	it := sc.WebhookEndpoints.List(&stripe.WebhookEndpointListParams{})
	for it.Next() {
		listed = append(listed, it.WebhookEndpoint())
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 24 || listed[0].ID != created.ID || listed[0].Secret != "" {
		t.Fatalf("listed %d endpoints, first %+v; want 24, the new one first, without its secret", len(listed), listed[0])
	}
	if pages := len(p.Filter(http.MethodGet, "/v1/webhook_endpoints")); pages != 3 {
		t.Errorf("%d list requests, want 3 pages of 10", pages)
	}

	got, err := sc.WebhookEndpoints.Get(created.ID, nil)
	if err != nil || got.Secret != "" || got.URL != created.URL {
		t.Fatalf("retrieve: %+v %v", got, err)
	}
	eps.Disable(created.ID)
	upd, err := sc.WebhookEndpoints.Update(created.ID, &stripe.WebhookEndpointParams{
		Disabled: stripe.Bool(false), EnabledEvents: stripe.StringSlice([]string{"invoice.payment_failed"}),
	})
	if err != nil || upd.Status != "enabled" || !slices.Equal(upd.EnabledEvents, []string{"invoice.payment_failed"}) {
		t.Fatalf("update: %+v %v", upd, err)
	}
	_, err = sc.WebhookEndpoints.Update(created.ID, &stripe.WebhookEndpointParams{APIVersion: stripe.String("2025-01-27")})
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusBadRequest {
		t.Fatalf("updating the API version: %v, want 400", err)
	}
	if _, err := sc.WebhookEndpoints.Del(created.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.WebhookEndpoints.Get(created.ID, nil); !errors.As(err, &se) || se.HTTPStatusCode != http.StatusNotFound {
		t.Fatalf("retrieve after delete: %v, want 404", err)
	}
	if n := len(eps.All()); n != 23 {
		t.Errorf("%d endpoints after delete, want 23", n)
	}
}

// The filters select the default configuration; an account that never saved its portal settings
// has none.
func TestPortalConfigurationsList(t *testing.T) {
	p, sc := endpointsClient(t)
	cfgs := p.PortalConfigurations()
	list := func() []*stripe.BillingPortalConfiguration {
		t.Helper()
		var out []*stripe.BillingPortalConfiguration
		it := sc.BillingPortalConfigurations.List(&stripe.BillingPortalConfigurationListParams{IsDefault: stripe.Bool(true)})
		for it.Next() {
			out = append(out, it.BillingPortalConfiguration())
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("%d default configurations before any was added", len(got))
	}
	cfgs.Add(true, true, false)
	cfgs.Add(false, true, true)
	want := cfgs.Add(true, true, true)
	got := list()
	if len(got) != 1 || got[0].ID != want || !got[0].Features.SubscriptionCancel.Enabled {
		t.Fatalf("default configurations %+v, want only %s, cancellation enabled", got, want)
	}
}
