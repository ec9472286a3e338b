package httpserver

import (
	"net/http"
	"time"
)

// The time budgets of a request, in one place so that they stay consistent with each other.
// The server can write an answer until WriteTimeout after it has read the request's header. The
// body may take up to ReadTimeout to arrive, then the handler's outbound section (database locks,
// calls to Stripe with their retries, recording the result) gets OutboundBudget, and WriteMargin
// is left to write the answer. So the work a request may do always ends while its answer can
// still be delivered: a charge Stripe made is never answered with an empty reply.
const (
	ReadHeaderTimeout = 10 * time.Second
	ReadTimeout       = 30 * time.Second
	// OutboundBudget bounds a request's whole outbound section; handlers that detach their work
	// from the client's context use it as their deadline.
	OutboundBudget = 80 * time.Second
	WriteMargin    = 10 * time.Second
	WriteTimeout   = ReadTimeout + OutboundBudget + WriteMargin
	IdleTimeout    = 2 * time.Minute
	// MaxHeaderBytes caps the request line and headers; net/http's default is 1 MB.
	MaxHeaderBytes = 64 << 10
)

// NewHTTPServer returns the http.Server for h on addr with the budgets above.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}
