package echo5idem_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echo5idem"
	"github.com/labstack/echo/v5"
)

// One line protects every POST and PATCH route of an Echo router; the
// caller comes from what the authentication middleware put in the Echo
// context. An error the handler returns is answered by Echo's error handler
// and replayed like any other answer.
func Example() {
	eng, err := core.New(memstore.New(), core.WithCaller(echo5idem.Caller(func(c *echo.Context) (string, error) {
		account, _ := c.Get("account").(string)
		return account, nil
	})))
	if err != nil {
		panic(err)
	}

	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // your auth
		return func(c *echo.Context) error {
			c.Set("account", c.Request().Header.Get("X-Account"))
			return next(c)
		}
	})
	e.Use(echo5idem.New(eng))
	orders := 0
	e.POST("/orders", func(c *echo.Context) error {
		orders++
		if orders == 1 {
			return echo.NewHTTPError(http.StatusConflict, "out of stock")
		}
		return c.JSON(http.StatusCreated, map[string]int{"id": orders})
	})

	for range 2 {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"tea"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account", "acct_1")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("handler runs:", orders)
	// Output:
	// 409 {"message":"out of stock"} replayed: false
	// 409 {"message":"out of stock"} replayed: true
	// handler runs: 1
}

// Echo's idiom: a Config with a Skipper, here for internal callers.
func ExampleNewWithConfig() {
	eng, _ := core.New(memstore.New(), core.WithSingleCaller())
	e := echo.New()
	e.Use(echo5idem.NewWithConfig(echo5idem.Config{
		Engine:  eng,
		Skipper: func(c *echo.Context) bool { return c.Request().Header.Get("X-Internal") == "1" },
		Options: []core.RouteOption{core.Methods("POST", "PATCH", "PUT")},
	}))
	fmt.Println("ok")
	// Output: ok
}

// Echo v5's MiddlewareConfigurator: ToMiddleware returns a configuration
// error instead of panicking.
func ExampleConfig_ToMiddleware() {
	mw, err := echo5idem.Config{}.ToMiddleware() // no Engine
	fmt.Println(mw == nil, errors.Is(err, core.ErrConfig))
	// Output: true true
}
