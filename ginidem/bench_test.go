package ginidem_test

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/internal/benchtest"
)

// BenchmarkOverhead is the in-process cost of the middleware on Gin: see
// package benchtest and BENCHMARKS.md.
func BenchmarkOverhead(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	benchtest.Run(b, func(e *core.Engine, opts ...core.RouteOption) http.Handler {
		r := gin.New()
		if e == nil {
			r.POST("/orders", gin.WrapF(benchtest.Handler))
		} else {
			r.POST("/orders", ginidem.New(e, opts...), gin.WrapF(benchtest.Handler))
		}
		return r
	})
}
