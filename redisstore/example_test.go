package redisstore_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/syncclock"
	"github.com/idemkit/idem/redisstore"
)

// A payments service on Redis behind Sentinel: every claim and
// completion waits for one replica, every process follows the server's
// clock, and the handler marks its effect before the charge.
func Example() {
	ctx := context.Background()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    "payments",
		SentinelAddrs: []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
	})
	store, err := redisstore.New(rdb, redisstore.WithReplicas(1, 500*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Check(ctx); err != nil { // reachable, and a replica to wait for
		log.Fatal(err)
	}
	clock, err := syncclock.New(ctx, store, 0) // the Redis server's clock (TIME)
	if err != nil {
		log.Fatal(err)
	}
	defer clock.Stop()
	engine, err := core.New(store, core.WithClock(clock.Now),
		core.WithCaller(func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }))
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /payments", engine.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := core.MarkEffect(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		key, _ := core.DownstreamKey(r.Context(), "charge") // the provider's own idempotency key
		_ = key                                             // charge(key, ...)
		w.WriteHeader(http.StatusCreated)
	})))
}
