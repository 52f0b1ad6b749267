package main

import (
	"fmt"
	"net/http"

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

// newRouter builds the orders API on one framework. Each framework runs
// auth as its own middleware on the API's routes (so its own 404 and 405
// stay its own), which puts the account in the request's context, where
// the engine's caller function and the handlers read it. The benchmark
// mode's routes (bench) are registered too, the protected ones behind
// idem's middleware.
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
	account := bearer(r)
	if account == "" {
		problem(w, http.StatusUnauthorized, "unauthorized", "send Authorization: Bearer <account>")
		return nil, false
	}
	return r.WithContext(withAccount(r.Context(), account)), true
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
	api := r.Group("", func(c *gin.Context) {
		req, ok := authorize(c.Writer, c.Request)
		if !ok {
			c.Abort()
			return
		}
		c.Request = req
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
	r.GET("/healthz", echo.WrapHandler(http.HandlerFunc(healthz)))
	// Route by route, not on a group: a group with middleware makes Echo
	// answer its unknown paths through that middleware (a 401, not a 404).
	auth := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req, ok := authorize(c.Response(), c.Request())
			if !ok {
				return nil
			}
			c.SetRequest(req)
			return next(c)
		}
	}
	r.POST("/orders", echo.WrapHandler(http.HandlerFunc(a.createOrder)), auth, echoidem.New(e))
	r.GET("/orders", echo.WrapHandler(http.HandlerFunc(a.listOrders)), auth)
	r.POST("/orders/:id/payments", echo.WrapHandler(http.HandlerFunc(a.pay)), auth, echoidem.New(e, a.paymentRoute()...))
	for _, b := range bench {
		if b.Protected {
			r.POST(b.Path, echo.WrapHandler(b.Handler), auth, echoidem.New(e))
		} else {
			r.POST(b.Path, echo.WrapHandler(b.Handler), auth)
		}
	}
	return r
}

func chiRouter(e *core.Engine, a *app, bench []benchrig.Route) http.Handler {
	r := chi.NewRouter()
	r.Get("/healthz", healthz)
	r.Group(func(api chi.Router) {
		api.Use(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				if req, ok := authorize(w, req); ok {
					next.ServeHTTP(w, req)
				}
			})
		})
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
