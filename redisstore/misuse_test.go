package redisstore_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/redisstore"
)

// TestAtomicModeRefused: the store has no transactions, so an engine over
// it runs routes in leased mode, a route that asks for atomic mode fails
// when it is built with an error naming the SQL stores, and Route.Within
// (atomic mode's caller-managed form) refuses with ErrConfig.
func TestAtomicModeRefused(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	defer c.Close()
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := any(s).(store.TxStore); ok {
		t.Fatal("redisstore.Store implements store.TxStore: Redis has no transaction a handler's writes could join")
	}
	e, err := core.New(s, core.WithSingleCaller(), core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	// Not a TxStore: every route of e is leased (the engine's mode follows
	// the store); asking for atomic mode panics.
	func() {
		defer func() {
			v := recover()
			err, _ := v.(error)
			if !errors.Is(err, core.ErrConfig) {
				t.Fatalf("Route(core.Atomic()) on Redis: panic %v, want an error wrapping ErrConfig", v)
			}
			for _, name := range []string{"sqlstore", "gormstore", "pgxstore"} {
				if !strings.Contains(err.Error(), name) {
					t.Errorf("error %q does not name %s", err, name)
				}
			}
		}()
		e.Route(core.Atomic())
	}()
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
	r.Header.Set(core.HeaderKey, "k")
	inTx := func(ctx context.Context, body func(context.Context) error) error { return body(ctx) }
	e.Route().Within(w, r, inTx, func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran") })
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") {
		t.Errorf("Within on Redis: %d %s, want 500 not-protected (the log names atomic mode)", w.Code, w.Body)
	}
}

// TestOptionsRefused: a bad configuration fails New with ErrConfig and a
// message that names the fix.
func TestOptionsRefused(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	for _, tc := range []struct {
		name string
		c    redis.UniversalClient
		opts []redisstore.Option
		want string
	}{
		{"nok, nil client", nil, nil, "nil client"},
		{"nok, a brace in the prefix", c, []redisstore.Option{redisstore.WithPrefix("a{b")}, "brace"},
		{"nok, negative replicas", c, []redisstore.Option{redisstore.WithReplicas(-1, time.Second)}, "negative"},
		{"nok, WAIT without a timeout", c, []redisstore.Option{redisstore.WithReplicas(1, 0)}, "timeout must be positive"},
		{"nok, WAIT on a ring", ring, []redisstore.Option{redisstore.WithReplicas(1, time.Second)}, "Ring"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := redisstore.New(tc.c, tc.opts...)
			if !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want ErrConfig naming %q", err, tc.want)
			}
		})
	}
}
