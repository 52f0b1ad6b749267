package ginidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/ginidem"
)

// One line protects every POST and PATCH route of a Gin router; the caller
// comes from what the authentication middleware put in the Gin context.
func Example() {
	e, err := core.New(memstore.New(), core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) {
		return c.GetString("account"), nil
	})))
	if err != nil {
		panic(err)
	}

	r := gin.New()
	r.Use(func(c *gin.Context) { c.Set("account", c.GetHeader("X-Account")) }) // your auth
	r.Use(ginidem.New(e))
	orders := 0
	r.POST("/orders", func(c *gin.Context) {
		orders++
		c.JSON(http.StatusCreated, gin.H{"id": orders})
	})

	for range 2 {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"tea"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account", "acct_1")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("orders created:", orders)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// orders created: 1
}

// Per route, with a scope: the route's keys are a namespace of their own
// (the same key on another route is another record, not a 422), under a
// name that survives renaming the path.
func ExampleNew() {
	e, _ := core.New(memstore.New(), core.WithSingleCaller())
	r := gin.New()
	r.POST("/v2/orders/:id/refunds", ginidem.New(e, core.Scope("refund-order")), func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"order": c.Param("id")})
	})
	fmt.Println(len(r.Routes()), "route protected")
	// Output: 1 route protected
}

// Gin's idiom for "every route but these": a Config with a Skipper, called
// after routing (c.FullPath() is the route pattern). A route with options
// of its own installs the middleware again: the two run as one protection
// with the route's options.
func ExampleNewWithConfig() {
	e, _ := core.New(memstore.New(), core.WithSingleCaller())
	r := gin.New()
	r.Use(ginidem.NewWithConfig(ginidem.Config{
		Engine:  e,
		Skipper: func(c *gin.Context) bool { return c.FullPath() == "/webhooks/:provider" },
	}))
	r.POST("/webhooks/:provider", func(c *gin.Context) { c.Status(http.StatusNoContent) })
	r.POST("/payments", ginidem.New(e, core.Leased()), func(c *gin.Context) { c.Status(http.StatusCreated) })

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("POST", "/webhooks/stripe", nil)) // no key needed: skipped
	fmt.Println(w.Code)
	// Output: 204
}
