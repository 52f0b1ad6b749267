package chiidem_test

import (
	"net/http"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/internal/benchtest"
)

// BenchmarkOverhead is the in-process cost of the middleware on chi, used
// per route (r.With) as in the example service: see package benchtest and
// BENCHMARKS.md.
func BenchmarkOverhead(b *testing.B) {
	benchtest.Run(b, func(e *core.Engine, opts ...core.RouteOption) http.Handler {
		r := chi.NewRouter()
		if e == nil {
			r.Post("/orders", benchtest.Handler)
		} else {
			r.With(chiidem.New(e, opts...)).Post("/orders", benchtest.Handler)
		}
		return r
	})
}
