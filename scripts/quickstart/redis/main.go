// Command redis is the README's Redis store quick start (README.md,
// "Quick starts"; redisstore/README.md): leased mode on Redis, waiting
// for one replica on every write, on the server's clock.
package main

import (
	"context"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/syncclock"
	"github.com/idemkit/idem/redisstore"
)

func main() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")}) // or NewFailoverClient, NewClusterClient
	store, err := redisstore.New(rdb, redisstore.WithReplicas(1, 500*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Check(ctx); err != nil {
		log.Fatal(err)
	}
	clock, err := syncclock.New(ctx, store, 0) // the Redis server's clock
	if err != nil {
		log.Fatal(err)
	}
	defer clock.Stop()
	e, err := core.New(store, core.WithClock(clock.Now), core.WithCaller(func(r *http.Request) (string, error) {
		return r.Header.Get("Authorization"), nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := core.MarkEffect(r.Context()); err != nil { // before the external call
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
