package httpserver

import (
	"net/http"
	"net/http/pprof"
)

// NewDebugServer serves Go's profiler under /debug/pprof/ on addr (http.debug_addr, a loopback
// address): for profiling a running replica without rebuilding it. Its own mux, so nothing is
// registered on http.DefaultServeMux. No write timeout: a CPU profile streams for its ?seconds=.
func NewDebugServer(addr string) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &http.Server{
		Addr:              addr,
		Handler:           mux,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}
