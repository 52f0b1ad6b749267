package echoidem_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/internal/benchtest"
	"github.com/labstack/echo/v4"
)

// BenchmarkOverhead is the in-process cost of the middleware on Echo: see
// package benchtest and BENCHMARKS.md.
func BenchmarkOverhead(b *testing.B) {
	benchtest.Run(b, func(e *core.Engine, opts ...core.RouteOption) http.Handler {
		r := echo.New()
		h := echo.WrapHandler(http.HandlerFunc(benchtest.Handler))
		if e == nil {
			r.POST("/orders", h)
		} else {
			r.POST("/orders", h, echoidem.New(e, opts...))
		}
		return r
	})
}
