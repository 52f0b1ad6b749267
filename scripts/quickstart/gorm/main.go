// Command gorm is the README's GORM store quick start (README.md, "Quick
// starts" and "A service that owns its transaction"; gormstore/README.md),
// on SQLite (github.com/glebarez/sqlite, no cgo).
package main

import (
	"context"
	"log"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/glebarez/sqlite"
	"gorm.io/gorm"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/gormstore"
)

type order struct {
	ID   uint
	Item string
}

func main() {
	ctx := context.Background()
	db, err := gorm.Open(sqlite.Open("quickstart.db"), &gorm.Config{}) // or postgres.Open, mysql.Open
	if err != nil {
		log.Fatal(err)
	}
	// Repositories that write through your own *gorm.DB join the request's
	// transaction with the plugin.
	if err := db.Use(gormstore.Plugin()); err != nil {
		log.Fatal(err)
	}
	store, err := gormstore.New(db) // dialect from db.Dialector.Name()
	if err != nil {
		log.Fatal(err)
	}
	_ = store.Migrate(ctx)
	if err := store.Check(ctx); err != nil { // table shape and server, at start-up
		log.Fatal(err) // names the fix ("run store.Migrate", ...)
	}
	if err := db.AutoMigrate(&order{}); err != nil {
		log.Fatal(err)
	}
	e, err := core.New(store, core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) {
		return c.GetString("account"), nil
	})))
	if err != nil {
		log.Fatal(err)
	}

	r := gin.New()
	r.Use(func(c *gin.Context) { c.Set("account", c.GetHeader("Authorization")) })
	// Atomic mode: the handler writes through the transaction the middleware began.
	r.POST("/orders", ginidem.New(e), func(c *gin.Context) {
		tx := gormstore.DB(c.Request.Context()) // not gormstore.DB(c): that *gorm.DB carries core.ErrNoTx
		o := order{Item: "tea"}
		if err := tx.Create(&o).Error; err != nil { // commits with the key row, before the client sees 201
			c.Status(http.StatusInternalServerError)
			return
		}
		c.JSON(http.StatusCreated, o)
	})

	// A service that owns its transaction: Route.Within.
	route := e.Route()
	inTx := func(ctx context.Context, body func(context.Context) error) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return body(gormstore.WithTx(ctx, tx))
		})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		route.Within(w, r, inTx, createPayment) // createPayment: an ordinary handler
	})
	mux.Handle("/", r)
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

func createPayment(w http.ResponseWriter, r *http.Request) {
	if err := gormstore.DB(r.Context()).Create(&order{Item: "payment"}).Error; err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
}
