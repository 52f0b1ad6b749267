package examples_test

import (
	"net/http"
	"regexp"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/ginidem"
	"github.com/labstack/echo/v4"
)

func init() { gin.SetMode(gin.TestMode) }

// param matches a ServeMux/chi path parameter ("{id}").
var param = regexp.MustCompile(`\{(\w+)\}`)

// colon translates "/orders/{id}" to Gin's and Echo's "/orders/:id".
func colon(p string) string { return param.ReplaceAllString(p, ":$1") }

func ginRouter(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
	r := gin.New()
	for _, rt := range routes {
		r.Handle(rt.Method, colon(rt.Pattern), ginidem.New(e, rt.Options...), gin.WrapF(rt.Handler))
	}
	return r
}

func chiRouter(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
	r := chi.NewRouter()
	for _, rt := range routes {
		r.With(chiidem.New(e, rt.Options...)).MethodFunc(rt.Method, rt.Pattern, rt.Handler)
	}
	return r
}

func echoRouter(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
	r := echo.New()
	for _, rt := range routes {
		r.Add(rt.Method, colon(rt.Pattern), echo.WrapHandler(rt.Handler), echoidem.New(e, rt.Options...))
	}
	return r
}

// TestAcrossRouters runs the cross-router scenarios (one key through two
// routers on one store, as two replicas in a rolling migration from one
// router to another) for every pair of adapters: Gin's
// /orders/:id/payments and chi's /orders/{id}/payments are one route.
func TestAcrossRouters(t *testing.T) {
	routers := []struct {
		name string
		f    scenario.Factory
	}{{"gin", ginRouter}, {"chi", chiRouter}, {"echo", echoRouter}}
	for i, a := range routers {
		b := routers[(i+1)%len(routers)]
		t.Run(a.name+"-"+b.name, func(t *testing.T) { scenario.RunAcross(t, a.f, b.f) })
	}
}
