// Command chi is the README's chi and net/http quick start (README.md,
// "Quick starts"; chiidem/README.md).
package main

import (
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

type accountKey struct{}

func accountFrom(ctx interface{ Value(any) any }) string {
	s, _ := ctx.Value(accountKey{}).(string)
	return s
}

func main() {
	store := memstore.New()
	e, err := core.New(store, core.WithCaller(func(r *http.Request) (string, error) {
		return accountFrom(r.Context()), nil // whatever your auth middleware stored
	}))
	if err != nil {
		log.Fatal(err)
	}

	// chi: every POST and PATCH route, except the skipped ones; a route
	// with options of its own installs it again.
	r := chi.NewRouter()
	r.Use(chiidem.NewWithConfig(chiidem.Config{Engine: e, Skipper: func(r *http.Request) bool {
		return strings.HasPrefix(r.URL.Path, "/webhooks/") // before routing: the path, not the pattern
	}}))
	r.With(chiidem.New(e, core.Retention(time.Hour))).Post("/orders/{id}/refunds", create)

	// Or plain net/http: one route of a ServeMux...
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(create)))
	// ...or all of them.
	all := http.NewServeMux()
	all.HandleFunc("POST /orders", create)

	var h http.Handler = r
	switch os.Getenv("ROUTER") {
	case "mux":
		h = mux
	case "all":
		h = e.Handler(all)
	}
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", h))
}

func create(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
}
