package core_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

var isolationSeed = flag.Uint64("isolation.seed", 0, "seed of TestTenantIsolation (0: a new one, printed)")

// isoCallers and isoKeys are small on purpose, so that callers share keys
// all the time; some are chosen so that a naive concatenation of caller and
// key would collide ("a" + ":b" and "a:" + "b").
var (
	isoCallers = []string{"acme", "globex", "a", "a:", ":a", "initech", "A"}
	isoKeys    = []string{"k1", "k2", ":b", "b", "order-7", "a", "\"k1\""}
)

// isoReply is what the handler answers; it embeds who asked.
type isoReply struct {
	Caller string `json:"caller"`
	Key    string `json:"key"`
	Body   string `json:"body"`
	Run    int64  `json:"run"`
}

type isoResult struct {
	caller, key, body string
	status            int
	replayed          bool
	reply             []byte
}

// TestTenantIsolation is a property test: random (caller, key, body)
// triples sent concurrently through the net/http middleware, over memstore
// in leased and in atomic mode, with and without waiting for in-flight
// duplicates. Whatever the schedule, no answer produced for one caller ever
// reaches another: every handler answer and every replay names the caller
// and key that asked, every replay is an answer the handler gave that same
// caller for that key, a (caller, key) completes at most once, and a 422 or
// 409 only follows that caller's own use of the key. The seed is printed; rerun
// with -isolation.seed=N.
func TestTenantIsolation(t *testing.T) {
	seed := *isolationSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -isolation.seed=%d)", seed, seed)
	requests := 3000
	if testing.Short() {
		requests = 1000
	}
	for _, mode := range []struct {
		name   string
		atomic bool
		wait   time.Duration
	}{
		{"leased, reject in-flight", false, 0},
		{"leased, wait for in-flight", false, 200 * time.Millisecond},
		{"atomic, reject in-flight", true, 0},
		{"atomic, wait for in-flight", true, 200 * time.Millisecond},
	} {
		t.Run(mode.name, func(t *testing.T) {
			isolationRun(t, seed, requests, mode.atomic, mode.wait)
		})
	}
}

func isolationRun(t *testing.T, seed uint64, requests int, atomicMode bool, wait time.Duration) {
	var store store.Store = memstore.New()
	if atomicMode {
		store = store.(*memstore.Store).Atomic()
	}
	e, err := core.New(store,
		core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		core.WithCaller(func(r *http.Request) (string, error) { return r.Header.Get("X-Caller"), nil }))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		info, _ := core.AttemptFrom(r.Context())
		key := info.Identity.Key
		time.Sleep(time.Duration(n%3) * time.Millisecond) // overlap duplicates
		status := http.StatusCreated
		if strings.Contains(string(body), `"v":2`) {
			status = http.StatusTooManyRequests // released: a retry may run
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(isoReply{Caller: r.Header.Get("X-Caller"), Key: key, Body: string(body), Run: n})
	})
	opts := []core.RouteOption{core.Scope("POST /iso")}
	if wait > 0 {
		opts = append(opts, core.WaitInFlight(wait))
	}
	srv := httptest.NewServer(e.Handler(handler, opts...))
	defer srv.Close()
	client := srv.Client()

	const workers = 16
	results := make([][]isoResult, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for range requests / workers {
				c := isoCallers[rng.IntN(len(isoCallers))]
				k := isoKeys[rng.IntN(len(isoKeys))]
				if rng.IntN(2) == 0 {
					k = fmt.Sprintf("r%d", rng.IntN(64))
				}
				v := 0 // mostly the same body: duplicates, not mismatches
				if p := rng.IntN(20); p < 2 {
					v = 1
				} else if p < 4 {
					v = 2
				}
				body := fmt.Sprintf(`{"v":%d}`, v)
				req, err := http.NewRequest("POST", srv.URL+"/iso", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Caller", c)
				req.Header.Set(core.HeaderKey, k)
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				reply, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Error(err)
					return
				}
				results[w] = append(results[w], isoResult{caller: c, key: k, body: body, status: resp.StatusCode,
					replayed: resp.Header.Get(core.HeaderReplayed) == "true", reply: reply})
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.Fatalf("seed %d", seed)
	}
	checkIsolation(t, seed, results)
}

func checkIsolation(t *testing.T, seed uint64, results [][]isoResult) {
	type ck struct{ caller, key string }
	executed := map[ck]map[string]bool{} // answers the handler gave, per caller and key
	completed := map[ck]int{}            // 201s the handler gave
	bodies := map[ck]map[string]bool{}   // bodies each caller sent with each key
	sent := map[ck]int{}
	// Keys are compared unquoted: "k1" and its RFC 8941 form share a record.
	var all []isoResult
	for _, rs := range results {
		all = append(all, rs...)
	}
	statuses := map[int]int{}
	for _, r := range all {
		id := ck{r.caller, strings.Trim(r.key, `"`)}
		sent[id]++
		if bodies[id] == nil {
			bodies[id] = map[string]bool{}
		}
		bodies[id][r.body] = true
		statuses[r.status]++
		if r.status != http.StatusCreated && r.status != http.StatusTooManyRequests {
			continue
		}
		var rep isoReply
		if err := json.Unmarshal(r.reply, &rep); err != nil {
			t.Fatalf("seed %d: %s %s: answer %d %q is not the handler's: %v", seed, r.caller, r.key, r.status, r.reply, err)
		}
		if rep.Caller != r.caller || rep.Key != strings.Trim(r.key, `"`) {
			t.Fatalf("seed %d: CROSS-CALLER LEAK: caller %q key %q got an answer made for caller %q key %q: %s",
				seed, r.caller, r.key, rep.Caller, rep.Key, r.reply)
		}
		if !r.replayed {
			if executed[id] == nil {
				executed[id] = map[string]bool{}
			}
			executed[id][string(r.reply)] = true
			if r.status == http.StatusCreated {
				completed[id]++
			}
		}
	}
	for _, r := range all {
		id := ck{r.caller, strings.Trim(r.key, `"`)}
		switch {
		case r.replayed:
			if !executed[id][string(r.reply)] {
				t.Fatalf("seed %d: caller %q key %q got a replay %q the handler never gave it", seed, r.caller, r.key, r.reply)
			}
		case r.status == http.StatusUnprocessableEntity:
			if len(bodies[id]) < 2 {
				t.Fatalf("seed %d: caller %q key %q got 422 but only ever sent %v: another caller's record", seed, r.caller, r.key, bodies[id])
			}
		case r.status == http.StatusConflict:
			if sent[id] < 2 {
				t.Fatalf("seed %d: caller %q key %q got 409 on its only request: another caller's attempt", seed, r.caller, r.key)
			}
		case r.status == http.StatusCreated, r.status == http.StatusTooManyRequests:
		default:
			t.Fatalf("seed %d: caller %q key %q: unexpected status %d %q", seed, r.caller, r.key, r.status, r.reply)
		}
	}
	for id, n := range completed {
		if n > 1 {
			t.Fatalf("seed %d: caller %q key %q completed %d times", seed, id.caller, id.key, n)
		}
	}
	t.Logf("%d requests, statuses %v", len(all), statuses)
}
