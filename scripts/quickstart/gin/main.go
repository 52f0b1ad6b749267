// Command gin is the README's Gin quick start (README.md, "Quick starts";
// ginidem/README.md).
package main

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/ginidem"
)

func main() {
	store := memstore.New()
	e, err := core.New(store, core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) {
		return c.GetString("account"), nil // set by your auth middleware with c.Set
	})))
	if err != nil {
		log.Fatal(err)
	}
	auth := func(c *gin.Context) { c.Set("account", c.GetHeader("Authorization")) }

	r := gin.New()
	r.Use(auth, ginidem.NewWithConfig(ginidem.Config{Engine: e, // every POST and PATCH route...
		Skipper: func(c *gin.Context) bool { return c.FullPath() == "/webhooks/:provider" }, // ...but this one
	}))
	r.POST("/refunds", ginidem.New(e, core.Retention(time.Hour)), refund) // this one with its own options

	// A service that owns its transaction: ginidem.Within (README.md, "A
	// service that owns its transaction"). memstore is not a TxStore, so
	// this route would answer 500; a gormstore or sqlstore engine serves it.
	route := e.Route()
	inTx := func(ctx context.Context, body func(context.Context) error) error { return body(ctx) }
	r.POST("/payments", func(c *gin.Context) { ginidem.Within(c, route, inTx, refund) })

	log.Fatal(http.ListenAndServe("127.0.0.1:8080", r))
}

func refund(c *gin.Context) {
	c.JSON(http.StatusCreated, gin.H{"refund": "r_1"})
}
