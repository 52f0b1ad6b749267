// Command echo is the README's Echo v4 quick start (README.md, "Quick
// starts"; echoidem/README.md).
package main

import (
	"log"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echoidem"
)

func main() {
	store := memstore.New()
	eng, err := core.New(store, core.WithCaller(echoidem.Caller(func(c echo.Context) (string, error) {
		account, _ := c.Get("account").(string) // set by your auth middleware with c.Set
		return account, nil
	})))
	if err != nil {
		log.Fatal(err)
	}
	auth := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Set("account", c.Request().Header.Get("Authorization"))
			return next(c)
		}
	}
	skipWebhooks := func(c echo.Context) bool { return c.Path() == "/webhooks/:provider" }

	e := echo.New()
	e.Use(auth, echoidem.NewWithConfig(echoidem.Config{Engine: eng, Skipper: skipWebhooks})) // all routes but the skipped
	e.POST("/orders/:id/refunds", refund, echoidem.New(eng, core.Retention(time.Hour)))
	log.Fatal(e.Start("127.0.0.1:8080"))
}

func refund(c echo.Context) error {
	return c.JSON(http.StatusCreated, map[string]string{"refund": "r_1"})
}
