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
	"github.com/idemkit/idem/ginidem"
)

// newRouter builds the orders API on one framework. Each framework reads the
// caller the way its users usually do: an auth middleware stores the
// account, and the engine's caller function reads it back.
func newRouter(framework string, store core.Store, a *app, opts []core.Option) (http.Handler, *core.Engine, error) {
	switch framework {
	case "gin":
		return ginRouter(store, a, opts)
	case "echo":
		return echoRouter(store, a, opts)
	case "chi":
		return chiRouter(store, a, opts)
	}
	return nil, nil, fmt.Errorf("-framework %q: want gin, echo or chi", framework)
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

func unauthorized(w http.ResponseWriter) {
	problem(w, http.StatusUnauthorized, "unauthorized", "send Authorization: Bearer <account>")
}

func ginRouter(store core.Store, a *app, opts []core.Option) (http.Handler, *core.Engine, error) {
	e, err := core.New(store, append(opts, core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) {
		return c.GetString("account"), nil
	})))...)
	if err != nil {
		return nil, nil, err
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery())
	r.GET("/healthz", gin.WrapF(healthz))
	auth := func(c *gin.Context) {
		account := bearer(c.Request)
		if account == "" {
			unauthorized(c.Writer)
			c.Abort()
			return
		}
		c.Set("account", account)
		c.Request = c.Request.WithContext(withAccount(c.Request.Context(), account))
	}
	if a.begin != nil {
		r.POST("/orders-unprotected", auth, gin.WrapF(inTx(a.begin, a.createOrder)))
		r.POST("/settle-unprotected", auth, gin.WrapF(inTx(a.begin, a.settle)))
		r.POST("/settle", auth, ginidem.New(e), gin.WrapF(a.settle))
	}
	orders := r.Group("/orders", auth)
	orders.POST("", ginidem.New(e), gin.WrapF(a.createOrder))
	orders.GET("", gin.WrapF(a.listOrders))
	orders.POST("/:id/payments", ginidem.New(e, a.paymentRoute()...), gin.WrapF(a.pay))
	return r, e, nil
}

func echoRouter(store core.Store, a *app, opts []core.Option) (http.Handler, *core.Engine, error) {
	e, err := core.New(store, append(opts, core.WithCaller(echoidem.Caller(func(c echo.Context) (string, error) {
		s, _ := c.Get("account").(string)
		return s, nil
	})))...)
	if err != nil {
		return nil, nil, err
	}
	r := echo.New()
	r.HideBanner, r.HidePort = true, true
	r.GET("/healthz", echo.WrapHandler(http.HandlerFunc(healthz)))
	auth := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			account := bearer(c.Request())
			if account == "" {
				unauthorized(c.Response())
				return nil
			}
			c.Set("account", account)
			c.SetRequest(c.Request().WithContext(withAccount(c.Request().Context(), account)))
			return next(c)
		}
	}
	if a.begin != nil {
		r.POST("/orders-unprotected", echo.WrapHandler(inTx(a.begin, a.createOrder)), auth)
		r.POST("/settle-unprotected", echo.WrapHandler(inTx(a.begin, a.settle)), auth)
		r.POST("/settle", echo.WrapHandler(http.HandlerFunc(a.settle)), auth, echoidem.New(e))
	}
	g := r.Group("/orders", auth)
	g.POST("", echo.WrapHandler(http.HandlerFunc(a.createOrder)), echoidem.New(e))
	g.GET("", echo.WrapHandler(http.HandlerFunc(a.listOrders)))
	g.POST("/:id/payments", echo.WrapHandler(http.HandlerFunc(a.pay)), echoidem.New(e, a.paymentRoute()...))
	return r, e, nil
}

func chiRouter(store core.Store, a *app, opts []core.Option) (http.Handler, *core.Engine, error) {
	e, err := core.New(store, append(opts, core.WithCaller(func(r *http.Request) (string, error) {
		return accountFrom(r.Context()), nil
	}))...)
	if err != nil {
		return nil, nil, err
	}
	r := chi.NewRouter()
	r.Get("/healthz", healthz)
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			account := bearer(req)
			if account == "" {
				unauthorized(w)
				return
			}
			next.ServeHTTP(w, req.WithContext(withAccount(req.Context(), account)))
		})
	}
	if a.begin != nil {
		r.With(auth).Post("/orders-unprotected", inTx(a.begin, a.createOrder))
		r.With(auth).Post("/settle-unprotected", inTx(a.begin, a.settle))
		r.With(auth, chiidem.New(e)).Post("/settle", a.settle)
	}
	r.Route("/orders", func(r chi.Router) {
		r.Use(auth)
		r.With(chiidem.New(e)).Post("/", a.createOrder)
		r.Get("/", a.listOrders)
		r.With(chiidem.New(e, a.paymentRoute()...)).Post("/{id}/payments", a.pay)
	})
	return r, e, nil
}
