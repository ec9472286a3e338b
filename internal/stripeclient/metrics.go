package stripeclient

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Calls counts every HTTP request to Stripe (each of stripe-go's tries), by method, endpoint
// (the path with object ids as {id}, so the label set stays bounded) and status ("error" when
// no answer came). Registered by the composition root.
var Calls = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "billing_stripe_api_requests_total",
	Help: "HTTP requests to the Stripe API, by method, endpoint (ids as {id}) and status (error: no answer).",
}, []string{"method", "endpoint", "status"})

// idSegment is a Stripe object id (cus_…, sub_…, pi_…, cs_test_…): a short lowercase prefix,
// an underscore, then the id. Resource names (payment_intents, billing_portal) have longer words.
var idSegment = regexp.MustCompile(`^[a-z]{1,6}_[A-Za-z0-9_]+$`)

// Endpoint is path with its ids replaced by {id}.
func Endpoint(path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if idSegment.MatchString(p) {
			parts[i] = "{id}"
		}
	}
	return strings.Join(parts, "/")
}

type countingTransport struct{ next http.RoundTripper }

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	status := "error"
	if err == nil {
		status = strconv.Itoa(resp.StatusCode)
	}
	Calls.WithLabelValues(r.Method, Endpoint(r.URL.Path), status).Inc()
	return resp, err
}
