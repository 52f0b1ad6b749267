package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/examples/benchrig"
	"github.com/idemkit/idem/ginidem"
)

// newRouter builds the orders API, and the benchmark's routes (bench), on
// one framework. Each framework runs auth on the API's routes only (its own
// 404 and 405 stay its own); auth puts the account in the request's
// context, where the engine's caller function and the handlers read it.
func newRouter(framework string, store store.Store, a *app, bench []benchrig.Route, opts []core.Option) (http.Handler, *core.Engine, error) {
	e, err := core.New(store, append(opts, core.WithCaller(func(r *http.Request) (string, error) {
		return accountFrom(r.Context()), nil
	}))...)
	if err != nil {
		return nil, nil, err
	}
	switch framework {
	case "gin":
		return ginRouter(e, a, bench), e, nil
	case "echo":
		return echoRouter(e, a, bench), e, nil
	case "chi":
		return chiRouter(e, a, bench), e, nil
	}
	return nil, nil, fmt.Errorf("-framework %q: want gin, echo or chi", framework)
}

// authorize takes the caller from "Authorization: Bearer <account>" (a
// stand-in for real authentication) into r's context; without one it
// answers 401 and reports false.
func authorize(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	account, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if account = strings.TrimSpace(account); !ok || account == "" {
		problem(w, http.StatusUnauthorized, "unauthorized", "send Authorization: Bearer <account>")
		return nil, false
	}
	return r.WithContext(context.WithValue(r.Context(), accountKey{}, account)), true
}

// auth is authorize as net/http middleware (chi's, and Echo's through
// echo.WrapMiddleware).
func auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r, ok := authorize(w, r); ok {
			next.ServeHTTP(w, r)
		}
	})
}

// paymentRoute is the options of POST /orders/{id}/payments: leased (the
// charge is an external call, outside the database transaction), with a
// resolver that settles a payment left indeterminate from the provider's
// record; named for the completer, with the request recorded for the resolver.
func (a *app) paymentRoute() []core.RouteOption {
	return []core.RouteOption{core.Leased(), core.WithResolver(a.settlePayment), core.Name("payments"), core.RecordRequest(nil)}
}

func ginRouter(e *core.Engine, a *app, bench []benchrig.Route) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery())
	api := r.Group("", func(c *gin.Context) {
		if req, ok := authorize(c.Writer, c.Request); ok {
			c.Request = req
		} else {
			c.Abort()
		}
	})
	api.POST("/orders", ginidem.New(e), gin.WrapF(a.createOrder))
	api.GET("/orders", gin.WrapF(a.listOrders))
	api.POST("/orders/:id/payments", ginidem.New(e, a.paymentRoute()...), gin.WrapF(a.pay))
	for _, b := range bench {
		if b.Protected {
			api.POST(b.Path, ginidem.New(e), gin.WrapF(b.Handler))
		} else {
			api.POST(b.Path, gin.WrapF(b.Handler))
		}
	}
	return r
}

func echoRouter(e *core.Engine, a *app, bench []benchrig.Route) http.Handler {
	r := echo.New()
	r.HideBanner, r.HidePort = true, true
	// Route by route, not on a group: a group with middleware makes Echo
	// answer its unknown paths through that middleware (a 401, not a 404).
	authMW := echo.WrapMiddleware(auth)
	r.POST("/orders", echo.WrapHandler(http.HandlerFunc(a.createOrder)), authMW, echoidem.New(e))
	r.GET("/orders", echo.WrapHandler(http.HandlerFunc(a.listOrders)), authMW)
	r.POST("/orders/:id/payments", echo.WrapHandler(http.HandlerFunc(a.pay)), authMW, echoidem.New(e, a.paymentRoute()...))
	for _, b := range bench {
		if b.Protected {
			r.POST(b.Path, echo.WrapHandler(b.Handler), authMW, echoidem.New(e))
		} else {
			r.POST(b.Path, echo.WrapHandler(b.Handler), authMW)
		}
	}
	return r
}

func chiRouter(e *core.Engine, a *app, bench []benchrig.Route) http.Handler {
	r := chi.NewRouter()
	r.Group(func(api chi.Router) {
		api.Use(auth)
		api.With(chiidem.New(e)).Post("/orders", a.createOrder)
		api.Get("/orders", a.listOrders)
		api.With(chiidem.New(e, a.paymentRoute()...)).Post("/orders/{id}/payments", a.pay)
		for _, b := range bench {
			if b.Protected {
				api.With(chiidem.New(e)).Post(b.Path, b.Handler)
			} else {
				api.Post(b.Path, b.Handler)
			}
		}
	})
	return r
}
