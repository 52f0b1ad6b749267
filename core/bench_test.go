package core_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/internal/benchtest"
)

// BenchmarkOverhead is the in-process cost of the middleware on net/http
// (ServeMux, Engine.Handler): see package benchtest and BENCHMARKS.md.
func BenchmarkOverhead(b *testing.B) {
	benchtest.Run(b, func(e *core.Engine, opts ...core.RouteOption) http.Handler {
		mux := http.NewServeMux()
		var h http.Handler = http.HandlerFunc(benchtest.Handler)
		if e != nil {
			h = e.Handler(h, opts...)
		}
		mux.Handle("POST /orders", h)
		return mux
	})
}
