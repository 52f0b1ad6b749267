package main

import (
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/examples/benchrig"
	"github.com/idemkit/idem/ginidem"
)

// newRouter builds the orders API on one framework, behind auth: one
// net/http middleware in front of every framework puts the account in the
// request's context, where the engine's caller function and the handlers
// read it. The benchmark mode's routes (bench) are registered too, the
// protected ones behind idem's middleware.
func newRouter(framework string, store core.Store, a *app, bench []benchrig.Route, opts []core.Option) (http.Handler, *core.Engine, error) {
	e, err := core.New(store, append(opts, core.WithCaller(func(r *http.Request) (string, error) {
		return accountFrom(r.Context()), nil
	}))...)
	if err != nil {
		return nil, nil, err
	}
	switch framework {
	case "gin":
		return auth(ginRouter(e, a, bench)), e, nil
	case "echo":
		return auth(echoRouter(e, a, bench)), e, nil
	case "chi":
		return auth(chiRouter(e, a, bench)), e, nil
	}
	return nil, nil, fmt.Errorf("-framework %q: want gin, echo or chi", framework)
}

// auth takes the caller from "Authorization: Bearer <account>" (a stand-in
// for real authentication): every route but GET /healthz needs one.
func auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		account := bearer(r)
		if account == "" {
			problem(w, http.StatusUnauthorized, "unauthorized", "send Authorization: Bearer <account>")
			return
		}
		next.ServeHTTP(w, r.WithContext(withAccount(r.Context(), account)))
	})
}

// paymentRoute is the options of POST /orders/{id}/payments: leased (the
// charge is an external call, outside the database transaction), with its
// own resolver, which settles a payment left indeterminate from the
// provider's record.
func (a *app) paymentRoute() []core.RouteOption {
	return []core.RouteOption{core.Leased(), core.WithResolver(a.settlePayment),
		// Named for the completer, which settles a payment left
		// indeterminate without a client; the request is recorded for
		// the resolver, which records the missing payment from it.
		core.Name("payments"), core.RecordRequest(nil)}
}

func ginRouter(e *core.Engine, a *app, bench []benchrig.Route) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery())
	r.GET("/healthz", gin.WrapF(healthz))
	r.POST("/orders", ginidem.New(e), gin.WrapF(a.createOrder))
	r.GET("/orders", gin.WrapF(a.listOrders))
	r.POST("/orders/:id/payments", ginidem.New(e, a.paymentRoute()...), gin.WrapF(a.pay))
	for _, b := range bench {
		if b.Protected {
			r.POST(b.Path, ginidem.New(e), gin.WrapF(b.Handler))
		} else {
			r.POST(b.Path, gin.WrapF(b.Handler))
		}
	}
	return r
}

func echoRouter(e *core.Engine, a *app, bench []benchrig.Route) http.Handler {
	r := echo.New()
	r.HideBanner, r.HidePort = true, true
	r.GET("/healthz", echo.WrapHandler(http.HandlerFunc(healthz)))
	r.POST("/orders", echo.WrapHandler(http.HandlerFunc(a.createOrder)), echoidem.New(e))
	r.GET("/orders", echo.WrapHandler(http.HandlerFunc(a.listOrders)))
	r.POST("/orders/:id/payments", echo.WrapHandler(http.HandlerFunc(a.pay)), echoidem.New(e, a.paymentRoute()...))
	for _, b := range bench {
		if b.Protected {
			r.POST(b.Path, echo.WrapHandler(b.Handler), echoidem.New(e))
		} else {
			r.POST(b.Path, echo.WrapHandler(b.Handler))
		}
	}
	return r
}

func chiRouter(e *core.Engine, a *app, bench []benchrig.Route) http.Handler {
	r := chi.NewRouter()
	r.Get("/healthz", healthz)
	r.With(chiidem.New(e)).Post("/orders", a.createOrder)
	r.Get("/orders", a.listOrders)
	r.With(chiidem.New(e, a.paymentRoute()...)).Post("/orders/{id}/payments", a.pay)
	for _, b := range bench {
		if b.Protected {
			r.With(chiidem.New(e)).Post(b.Path, b.Handler)
		} else {
			r.Post(b.Path, b.Handler)
		}
	}
	return r
}
