package reliability

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// redisAddrs returns the comma-separated addresses of env
// (IDEM_TEST_REDIS_ADDR, IDEM_TEST_REDIS_CLUSTER_ADDRS; scripts/dbs.sh
// start-redis writes them); a missing one skips t, or fails it under CI
// and IDEM_REQUIRE_DB.
func redisAddrs(t testing.TB, env string) []string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if sqlstoretest.Required() {
			t.Fatalf("%s is not set and a database is required (CI or %s is set)", env, sqlstoretest.EnvRequire)
		}
		t.Skipf("%s is not set; skipping (set it, or run scripts/test.sh)", env)
	}
	return strings.Split(v, ",")
}

// newRedisStore returns a store on c with a fresh key prefix, whose keys
// are deleted at cleanup.
func newRedisStore(t testing.TB, c redis.UniversalClient) *redisstore.Store {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	prefix := "idemrel:" + hex.EncodeToString(b[:]) + ":"
	s, err := redisstore.New(c, redisstore.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		del := func(ctx context.Context, c *redis.Client) error {
			iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				c.Del(ctx, iter.Val())
			}
			return iter.Err()
		}
		if cc, ok := c.(*redis.ClusterClient); ok {
			_ = cc.ForEachMaster(ctx, del)
		} else if rc, ok := c.(*redis.Client); ok {
			_ = del(ctx, rc)
		}
	})
	return s
}

// redisClient returns a client of the single test server (addr: through
// a proxy, or the server itself), closed at cleanup.
func redisClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLinearizableRedis runs the linearizability histories on redisstore:
// on one server, and on a 3-primary Redis Cluster (each record one key,
// so each in one hash slot).
func TestLinearizableRedis(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		c := redisClient(t, redisAddrs(t, "IDEM_TEST_REDIS_ADDR")[0])
		runLinearizability(t, "redisstore", linTarget{store: newRedisStore(t, c)})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redisAddrs(t, "IDEM_TEST_REDIS_CLUSTER_ADDRS")})
		t.Cleanup(func() { c.Close() })
		runLinearizability(t, "redisstore cluster", linTarget{store: newRedisStore(t, c)})
	})
}

// TestRedisFaults hammers the HTTP middleware over redisstore (leased
// mode) while a TCP proxy between go-redis and the server adds latency and
// cuts connections, all at once or one after a number of bytes (a script
// cut on its way in, or its reply on its way out: the write happened and
// the client never heard of it; go-redis may then resend it). The handler
// records one effect per execution, after core.MarkEffect. Afterwards,
// with the faults off:
//
//   - no key has more effects than distinct attempts: no second execution
//     by one attempt, and a new attempt only by a takeover of a lapsed
//     lease (leased mode's design);
//   - every 201 a client saw has its effect: no false success;
//   - every answer is 201, 409, 500 or 503 (409/503 with Retry-After);
//   - a completed 201 record has its effect, and no effect belongs to an
//     attempt the record has not reached.
func TestRedisFaults(t *testing.T) {
	addr := redisAddrs(t, "IDEM_TEST_REDIS_ADDR")[0]
	proxy := newFaultProxy(t, addr)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: 2, ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	st := newRedisStore(t, c)

	var (
		runs    atomic.Int64
		effMu   sync.Mutex
		effects = map[string]map[int]int{} // key -> attempt -> executions
	)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		info, _ := core.AttemptFrom(r.Context())
		key := info.Identity.Key
		core.MarkEffect(r.Context())
		effMu.Lock()
		if effects[key] == nil {
			effects[key] = map[int]int{}
		}
		effects[key][info.Attempt]++
		effMu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q}`, key)
	})
	e, err := core.New(st, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(handler, core.Scope("POST /orders"))
	ctx := context.Background()
	send := faultSender(h)
	seed, run := faultSeed(t)
	answers, faults := hammer(send, seed, run, func(rng *mrand.Rand) string {
		switch rng.IntN(4) {
		case 0:
			proxy.cutAll()
			return "cut all connections"
		case 1:
			proxy.cutBytes.Store(1 + rng.Int64N(400))
			return "cut one connection after N bytes"
		case 2:
			proxy.maxLatency.Store(int64(time.Duration(rng.IntN(5000)) * time.Microsecond))
			return "latency"
		}
		proxy.maxLatency.Store(0)
		return ""
	})
	proxy.maxLatency.Store(0)
	proxy.cutBytes.Store(0)

	statuses := map[int]int{}
	for _, a := range answers {
		statuses[a.status]++
	}
	t.Logf("%d requests, %d handler runs, statuses %v; faults %v; connections cut %d", len(answers), runs.Load(), statuses, faults, proxy.cuts.Load())
	if len(answers) < 20 || statuses[http.StatusCreated] == 0 {
		t.Fatalf("the hammer did not get through (%d requests, statuses %v): the test proves nothing", len(answers), statuses)
	}
	sent, retries := retryAll(answers, send)
	answers = append(answers, retries...)

	effMu.Lock()
	defer effMu.Unlock()
	count := func(key string) (n, maxAttempt int) {
		for at, k := range effects[key] {
			n += k
			maxAttempt = max(maxAttempt, at)
		}
		return n, maxAttempt
	}
	takeovers := 0
	for key, byAttempt := range effects {
		for at, k := range byAttempt {
			if k > 1 {
				t.Errorf("SECOND EXECUTION: %s ran %d times as attempt %d (seed %d)", key, k, at, seed)
			}
		}
		takeovers += len(byAttempt) - 1
	}
	for _, a := range answers {
		switch a.status {
		case http.StatusCreated:
			if n, _ := count(a.key); n == 0 {
				t.Errorf("FALSE SUCCESS: %s got 201 (replayed=%v) but has no effect (seed %d)", a.key, a.replayed, seed)
			}
		case http.StatusConflict, http.StatusServiceUnavailable:
			if a.retry == "" {
				t.Errorf("%s: %d without Retry-After: %s", a.key, a.status, a.body)
			}
		case http.StatusInternalServerError:
		default:
			t.Errorf("%s: unexpected answer %d %s", a.key, a.status, a.body)
		}
	}
	byState := map[store.State]int{}
	for key := range sent {
		rec, err := st.Get(ctx, store.Identity{Scope: "POST /orders", Key: key}.ID(), time.Now())
		if err != nil {
			continue
		}
		byState[rec.State]++
		n, maxAttempt := count(key)
		if rec.State == store.StateCompleted && rec.Status == http.StatusCreated && n == 0 {
			t.Errorf("%s: completed 201 record without an effect", key)
		}
		if maxAttempt > rec.Attempt {
			t.Errorf("%s: an effect of attempt %d, but the record is at attempt %d", key, maxAttempt, rec.Attempt)
		}
	}
	t.Logf("records at the end: %v; takeovers that ran again after a lapsed lease: %d", byState, takeovers)
}
