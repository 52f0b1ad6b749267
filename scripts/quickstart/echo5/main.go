// Command echo5 is the Echo v5 quick start (echo5idem/README.md).
package main

import (
	"log"
	"net/http"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echo5idem"
)

func main() {
	store := memstore.New()
	eng, err := core.New(store, core.WithCaller(echo5idem.Caller(func(c *echo.Context) (string, error) {
		account, _ := c.Get("account").(string) // set by your auth middleware with c.Set
		return account, nil
	})))
	if err != nil {
		log.Fatal(err)
	}
	auth := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			c.Set("account", c.Request().Header.Get("Authorization"))
			return next(c)
		}
	}

	// The configuration error instead of a panic, as Echo v5's own
	// middleware configs offer:
	mw, err := echo5idem.Config{Engine: eng, Skipper: func(c *echo.Context) bool {
		return c.Path() == "/webhooks/:provider"
	}}.ToMiddleware()
	if err != nil {
		log.Fatal(err)
	}
	e := echo.New()
	e.Use(auth, mw)
	e.POST("/orders/:id/refunds", refund, echo5idem.New(eng, core.Retention(time.Hour)))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", e))
}

func refund(c *echo.Context) error {
	return c.JSON(http.StatusCreated, map[string]string{"refund": "r_1"})
}
