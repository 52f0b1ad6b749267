// Command fiber is the README's Fiber quick start (README.md, "Quick
// starts"; fiberidem/README.md).
package main

import (
	"context"
	"log"
	"strings"
	"time"

	"github.com/gofiber/fiber/v3"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberidem"
)

func main() {
	store := memstore.New()
	e, err := core.New(store, core.WithCaller(fiberidem.Caller(func(c fiber.Ctx) (string, error) {
		account, _ := c.Locals("account").(string) // set by your auth middleware with c.Locals
		return account, nil
	})))
	if err != nil {
		log.Fatal(err)
	}
	auth := func(c fiber.Ctx) error {
		c.Locals("account", strings.Clone(c.Get("Authorization")))
		return c.Next()
	}

	app := fiber.New()
	app.Use(auth, fiberidem.NewWithConfig(fiberidem.Config{Engine: e, Next: func(c fiber.Ctx) bool {
		return strings.HasPrefix(c.Path(), "/webhooks/") // before routing: the path, not the route
	}}))
	app.Post("/refunds", fiberidem.New(e, core.Retention(time.Hour)), refund) // options of its own

	// A service that owns its transaction: fiberidem.Within. memstore is
	// not a TxStore, so this route would answer 500; a gormstore or
	// sqlstore engine serves it.
	route := e.Route()
	inTx := func(ctx context.Context, body func(context.Context) error) error { return body(ctx) }
	app.Post("/payments", func(c fiber.Ctx) error { return fiberidem.Within(c, route, inTx, refund) })

	log.Fatal(app.Listen("127.0.0.1:8080"))
}

func refund(c fiber.Ctx) error {
	key, err := fiberidem.DownstreamKey(c, "refund") // for the payment provider
	if err != nil {
		return err
	}
	return c.Status(fiber.StatusCreated).JSON(fiber.Map{"refund": key})
}
