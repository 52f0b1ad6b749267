package echo5idem_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echo5idem"
	"github.com/idemkit/idem/internal/benchtest"
	"github.com/labstack/echo/v5"
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
			r.POST("/orders", h, echo5idem.New(e, opts...))
		}
		return r
	})
}
