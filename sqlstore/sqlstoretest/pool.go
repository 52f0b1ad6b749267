package sqlstoretest

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/internal/sqlmeasure"
)

// poolPlan sizes RunPool: a short run by default, more samples and the
// 2-second hold of the issue with -stores.measure.
type poolPlan struct {
	maxOpen int           // the pool's size
	dups    int           // concurrent duplicates of the long request
	hold    time.Duration // how long the first keeps its transaction open
	quiet   time.Duration // how long the quiet phase lasts
	workers int           // clients sending unrelated requests
	pause   time.Duration // between two requests of one client
	storms  int
}

func planPool() poolPlan {
	if sqlmeasure.Measure() {
		return poolPlan{maxOpen: 5, dups: 50, hold: 2 * time.Second, quiet: 3 * time.Second, workers: 8, pause: 5 * time.Millisecond, storms: 3}
	}
	return poolPlan{maxOpen: 5, dups: 50, hold: time.Second, quiet: 500 * time.Millisecond, workers: 4, pause: 10 * time.Millisecond, storms: 1}
}

// RunPool checks that a storm of duplicates of one long-running request
// does not starve unrelated requests of the pool's connections (issue 3,
// item 3), with the reject policy and with core.WaitInFlight(3s).
//
// The store's pool is limited to 5 connections. Unrelated requests (each
// with a key of its own, inserting a business row) come from 4 clients (8
// with -stores.measure) that send one after another, first in a quiet
// phase, then during a storm: 50 clients send the same
// request at once; the one that claims holds its transaction open (1 s, or
// 2 s with -stores.measure); the others get 409 and retry after its
// Retry-After (reject) or wait in the engine, which polls the store
// outside any transaction (wait). It asserts only what must hold on any
// machine: every unrelated request and every client of the storm gets its
// 201, nothing deadlocks, and the long request runs once. It logs the
// latency of unrelated requests (p50, p99, max) in the quiet phase and
// during the storm, how often a request waited for a pooled connection,
// and how fast the storm's duplicates were answered.
func RunPool(t *testing.T, cfg Config) {
	for _, p := range []struct {
		name string
		opts []core.RouteOption
	}{
		{"reject", nil},
		{"wait", []core.RouteOption{core.WaitInFlight(3 * time.Second)}},
	} {
		t.Run(p.name, func(t *testing.T) { runPool(t, cfg, p.name, p.opts) })
	}
}

func runPool(t *testing.T, cfg Config, policy string, opts []core.RouteOption) {
	plan := planPool()
	f := cfg.New(t)
	if f.DB == nil {
		t.Skip("the fixture has no pool to limit")
	}
	f.DB.SetMaxOpenConns(plan.maxOpen)
	f.DB.SetMaxIdleConns(plan.maxOpen)
	warm(t, f.DB, plan.maxOpen)
	srv := newOrderServer(t, f, false, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url := srv.URL + "/orders"
	var (
		unrelatedSent atomic.Int64
		stormRuns     int64
	)

	// unrelated runs plan.workers clients that each send requests with
	// keys of their own, one after another (plan.pause apart), until stop
	// is closed, and returns the latencies of the 201s. A closed loop: on
	// SQLite, whose single writer the long request holds, an open loop
	// faster than the writer drains would only measure its own backlog.
	unrelated := func(stop <-chan struct{}) (lat []time.Duration) {
		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		for range plan.workers {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(plan.pause):
					}
					n := unrelatedSent.Add(1)
					item := fmt.Sprintf("unrelated-%d", n)
					a := post(ctx, srv.client, url, "key-"+item, orderBody(item, 0))
					mu.Lock()
					if a.err != nil || a.status != http.StatusCreated || a.replayed {
						t.Errorf("unrelated request %d: %v, want its own 201", n, a)
					} else {
						lat = append(lat, a.latency)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return lat
	}

	phase := func(d time.Duration) (lat []time.Duration, st poolStats) {
		before := f.DB.Stats()
		stop := make(chan struct{})
		time.AfterFunc(d, func() { close(stop) })
		lat = unrelated(stop)
		return lat, statsSince(before, f.DB.Stats())
	}

	quietLat, quietStats := phase(plan.quiet)

	var (
		stormLat, dupAnswers []time.Duration
		stormStats           poolStats
		attempts             int
	)
	for i := range plan.storms {
		item := fmt.Sprintf("slow-%d", i)
		key, body := "key-"+item+"-"+Table(), orderBody(item, int(plan.hold/time.Millisecond))
		before := f.DB.Stats()
		stop := make(chan struct{})
		loadDone := make(chan []time.Duration, 1)
		go func() { loadDone <- unrelated(stop) }()

		type client struct {
			final    answer
			first    time.Duration
			attempts int
		}
		clients := make([]client, plan.dups)
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for c := range clients {
			wg.Go(func() {
				<-gate
				for {
					a := post(ctx, srv.client, url, key, body)
					clients[c].attempts++
					if clients[c].attempts == 1 {
						clients[c].first = a.latency
					}
					if a.err != nil || a.status != http.StatusConflict {
						clients[c].final = a
						return
					}
					// A client that honours Retry-After.
					secs, err := strconv.Atoi(a.retryAfter)
					if err != nil || secs <= 0 {
						secs = 1
					}
					select {
					case <-ctx.Done():
						clients[c].final = answer{err: ctx.Err()}
						return
					case <-time.After(time.Duration(secs) * time.Second):
					}
				}
			})
		}
		close(gate)
		wg.Wait()
		close(stop)
		stormLat = append(stormLat, <-loadDone...)
		stormStats.add(statsSince(before, f.DB.Stats()))

		executed := 0
		var body201 []byte
		for c, cl := range clients {
			attempts += cl.attempts
			a := cl.final
			if cl.attempts > 1 || a.replayed {
				dupAnswers = append(dupAnswers, cl.first) // not the client that executed
			}
			if a.err != nil || a.status != http.StatusCreated {
				t.Errorf("storm %d, client %d: %v after %d attempts, want the 201", i, c, a, cl.attempts)
				continue
			}
			if !a.replayed {
				executed++
			}
			if body201 == nil {
				body201 = a.body
			} else if string(a.body) != string(body201) {
				t.Errorf("storm %d, client %d: 201 %q, another client got %q", i, c, a.body, body201)
			}
		}
		if executed != 1 {
			t.Errorf("storm %d: %d clients got an executed 201, want 1", i, executed)
		}
		if n := f.Count(t, item); n != 1 {
			t.Errorf("storm %d: %d business rows, want 1", i, n)
		}
		stormRuns++
	}
	if runs, want := srv.runs.Load(), unrelatedSent.Load()+stormRuns; runs != want {
		t.Errorf("the handler ran %d times for %d distinct requests", runs, want)
	}

	t.Logf("%v, %s, pool of %d, %d duplicates holding %v (x%d), %d unrelated clients:\n"+
		"\tunrelated quiet: %s; waited for a connection %d times (%v)\n"+
		"\tunrelated storm: %s; waited for a connection %d times (%v)\n"+
		"\tduplicates (all but the executing client): first answer (%s) %s; %d requests for %d clients",
		cfg.Dialect, policy, plan.maxOpen, plan.dups, plan.hold, plan.storms, plan.workers,
		percentiles(quietLat), quietStats.waits, quietStats.waited.Round(time.Millisecond),
		percentiles(stormLat), stormStats.waits, stormStats.waited.Round(time.Millisecond),
		map[string]string{"reject": "409", "wait": "the replay, after waiting"}[policy], percentiles(dupAnswers), attempts, plan.dups*plan.storms)
}

// poolStats is what a phase added to sql.DBStats.
type poolStats struct {
	waits  int64
	waited time.Duration
}

func (p *poolStats) add(q poolStats) { p.waits += q.waits; p.waited += q.waited }

func statsSince(before, after sql.DBStats) poolStats {
	return poolStats{waits: after.WaitCount - before.WaitCount, waited: after.WaitDuration - before.WaitDuration}
}

// percentiles formats p50, p99 and max of ds.
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no samples"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration {
		i := int(p*float64(len(s)) + 0.5)
		return s[min(max(i-1, 0), len(s)-1)]
	}
	r := func(d time.Duration) time.Duration {
		if d >= 10*time.Millisecond {
			return d.Round(time.Millisecond)
		}
		return d.Round(10 * time.Microsecond)
	}
	return fmt.Sprintf("p50 %v, p99 %v, max %v (n=%d)", r(q(0.50)), r(q(0.99)), r(s[len(s)-1]), len(s))
}
