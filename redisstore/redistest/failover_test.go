package redistest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/redisstore/internal/redisenv"
)

// TestFailoverStorm runs a payment storm through a Sentinel failover in
// which the promoted replica had fallen behind, the way asynchronous
// replication loses acknowledged writes: the replica's link to the
// primary is cut (its replication user disabled and its connection
// killed: a partition), the primary keeps acknowledging writes for a
// second and then stops answering (DEBUG SLEEP 8: a crash), the sentinels
// promote the replica, and the old primary, back, becomes its replica and
// drops what it alone had.
//
// Each payment is one key sent by two clients at once (a retry racing
// the first attempt), both retrying 409 and 503 until they get a final
// answer (201, or 500 for an outcome left unknown); the handler charges
// once per run, after core.MarkEffect, and takes 50-250 ms (the
// provider's latency). The engine runs WithoutTakeover, so a lapsed lease
// is settled as indeterminate, never run again.
//
//   - WAIT 1 (redisstore.WithReplicas(1, ...)): no key is charged twice:
//     a claim runs its handler only once a replica has it.
//   - no WAIT: claims and completions the primary acknowledged are lost
//     with it, and their retries charge again; the test counts them (it
//     asserts nothing about how many: that depends on the timing).
//
// Every 201 has its charge in both. The counts go to the log, and the
// README's durability table quotes them.
func TestFailoverStorm(t *testing.T) {
	sentinels := redisenv.List(t, redisenv.EnvSentinel, 3)
	master := redisenv.Get(t, redisenv.EnvSentinelMaster)
	for _, v := range []struct {
		name     string
		replicas int
	}{{"NoWait", 0}, {"Wait1", 1}} {
		t.Run(v.name, func(t *testing.T) {
			r := storm(t, sentinels, master, v.replicas)
			t.Logf("%s: %d payments, %d charges, %d charged twice or more, answers %v, failover in %v, record states %v",
				v.name, r.keys, r.charges, r.doubles, r.answers, r.failover.Round(time.Millisecond), r.states)
			if v.replicas > 0 && r.doubles > 0 {
				t.Errorf("WithReplicas(1): %d payments charged twice", r.doubles)
			}
		})
	}
}

type stormResult struct {
	keys, charges, doubles int
	answers                map[int]int
	states                 map[string]int
	failover               time.Duration
}

// healthy waits until the sentinels agree on a primary that has one
// replica online and in sync, and returns the primary's and the replica's
// addresses.
func healthy(t *testing.T, sentinels []string, master string) (primary, replica string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	ctx := t.Context()
	for {
		primary, replica = "", ""
		agree := true
		for _, a := range sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: a})
			addr, err := sc.GetMasterAddrByName(ctx, master).Result()
			replicas, rerr := sc.Replicas(ctx, master).Result()
			sc.Close()
			if err != nil || rerr != nil || len(addr) != 2 {
				agree = false
				break
			}
			p := addr[0] + ":" + addr[1]
			if primary != "" && p != primary {
				agree = false
			}
			primary = p
			for _, r := range replicas {
				if r["flags"] == "slave" && r["master-link-status"] == "ok" {
					replica = r["ip"] + ":" + r["port"]
				}
			}
		}
		if agree && replica != "" {
			c := redis.NewClient(&redis.Options{Addr: primary})
			info, err := c.Info(ctx, "replication").Result()
			c.Close()
			if err == nil && strings.Contains(info, "role:master") && strings.Contains(info, "connected_slaves:1") &&
				strings.Contains(info, "state=online") {
				return primary, replica
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sentinel group is not healthy after 60 s (primary %q, replica %q)", primary, replica)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func storm(t *testing.T, sentinels []string, master string, replicas int) stormResult {
	primary, replica := healthy(t, sentinels, master)
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: master, SentinelAddrs: sentinels,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	t.Cleanup(func() { c.Close() })
	var opts []redisstore.Option
	if replicas > 0 {
		opts = append(opts, redisstore.WithReplicas(replicas, 300*time.Millisecond))
	}
	st := newStore(t, c, opts...)
	if err := st.Check(t.Context()); err != nil {
		t.Fatal(err)
	}

	var (
		mu      sync.Mutex
		charges = map[string]int{}
	)
	seed := rand.Uint64()
	t.Logf("seed %d; primary %s, replica %s", seed, primary, replica)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := core.AttemptFrom(r.Context())
		key := info.Identity.Key
		if err := core.MarkEffect(r.Context()); err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		mu.Lock()
		charges[key]++
		mu.Unlock()
		n, _ := strconv.Atoi(strings.TrimPrefix(key, "pay-"))
		time.Sleep(time.Duration(50+(uint64(n)*seed)%200) * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%q}`, key)
	})
	e, err := core.New(st, core.WithSingleCaller(), core.WithLease(2*time.Second), core.WithoutTakeover(),
		core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(handler, core.Scope("POST /payments"))

	type answer struct {
		key    string
		status int
		body   string
	}
	var answers []answer
	// pay sends key until it gets a final answer (201 or 500), retrying
	// 409 and 503, for at most 40 s.
	pay := func(key string) {
		deadline := time.Now().Add(40 * time.Second)
		for {
			r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":100}`))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set(core.HeaderKey, key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code == http.StatusCreated || w.Code == http.StatusInternalServerError || time.Now().After(deadline) {
				mu.Lock()
				answers = append(answers, answer{key, w.Code, w.Body.String()})
				mu.Unlock()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	const workers, window = 16, 7 * time.Second
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for time.Since(start) < window {
				key := fmt.Sprintf("pay-%d", next.Add(1))
				var pair sync.WaitGroup
				pair.Go(func() { pay(key) })
				pair.Go(func() { time.Sleep(5 * time.Millisecond); pay(key) })
				pair.Wait()
			}
		})
	}

	// The failover, two seconds in.
	time.Sleep(2 * time.Second)
	pc := redis.NewClient(&redis.Options{Addr: primary, ReadTimeout: 20 * time.Second})
	defer pc.Close()
	// The replica is cut off: its link dropped, and it cannot reconnect
	// (its replication user is disabled). The primary goes on
	// acknowledging writes for a second, then stops answering.
	ctx := context.Background()
	if err := pc.Do(ctx, "acl", "setuser", "repl", "off").Err(); err != nil {
		t.Fatalf("ACL SETUSER repl off: %v", err)
	}
	if err := pc.Do(ctx, "client", "kill", "user", "repl").Err(); err != nil {
		t.Fatalf("CLIENT KILL USER repl: %v", err)
	}
	time.Sleep(time.Second)
	stopped := time.Now()
	var sleeps sync.WaitGroup
	sleeps.Go(func() {
		if err := pc.Do(ctx, "debug", "sleep", "8").Err(); err != nil {
			t.Errorf("DEBUG SLEEP on the primary: %v", err)
		}
	})
	var failover time.Duration
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sentinels[0]})
		addr, err := sc.GetMasterAddrByName(context.Background(), master).Result()
		sc.Close()
		if err == nil && len(addr) == 2 && addr[0]+":"+addr[1] == replica {
			failover = time.Since(stopped)
			break
		}
	}
	if failover == 0 {
		t.Error("the sentinels did not promote the replica within 30 s")
	}
	wg.Wait()
	sleeps.Wait()
	// The old primary is back; the sentinels make it a replica of the
	// new one, which it reaches as repl: turn that user on again.
	if err := pc.Do(ctx, "acl", "setuser", "repl", "on").Err(); err != nil {
		t.Fatalf("ACL SETUSER repl on: %v", err)
	}

	res := stormResult{answers: map[int]int{}, states: map[string]int{}, failover: failover}
	mu.Lock()
	defer mu.Unlock()
	keys := map[string]bool{}
	for _, a := range answers {
		keys[a.key] = true
		res.answers[a.status]++
		if a.status == http.StatusCreated && charges[a.key] == 0 {
			t.Errorf("FALSE SUCCESS: %s got 201 %s but was never charged", a.key, a.body)
		}
	}
	res.keys = len(keys)
	for key := range keys {
		res.charges += charges[key]
		if charges[key] > 1 {
			res.doubles++
		}
		rec, err := st.Get(context.Background(), store.Identity{Scope: "POST /payments", Key: key}.ID(), time.Now())
		if err != nil {
			res.states["absent"]++
		} else {
			res.states[rec.State.String()]++
		}
	}
	if res.keys < 50 {
		t.Fatalf("only %d payments: the storm proves nothing", res.keys)
	}
	healthy(t, sentinels, master) // the old primary is back, as a replica, for the next run
	return res
}
