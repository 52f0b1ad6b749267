package sqlstoretest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

// answer is what a client received.
type answer struct {
	status      int
	body        []byte
	contentType string
	replayed    bool
	retryAfter  string
	latency     time.Duration
	err         error
}

func (a answer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	return fmt.Sprintf("%d %q (replayed %v, %v)", a.status, a.body, a.replayed, a.latency.Round(time.Millisecond))
}

// post sends one POST with an Idempotency-Key and reads the whole answer.
func post(ctx context.Context, c *http.Client, url, key, body string) answer {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{
		status: resp.StatusCode, body: b, contentType: resp.Header.Get("Content-Type"),
		replayed:   resp.Header.Get(core.HeaderReplayed) == "true",
		retryAfter: resp.Header.Get("Retry-After"), latency: time.Since(start), err: err,
	}
}

// orderServer is a real HTTP service in middleware-managed atomic mode:
// core.Engine's handler on net/http, whose handler inserts one business row
// named by the request's "item" through the transaction of the request's
// context (Fixture.Insert) and answers 201 with a body no second execution
// could repeat (a random order id).
type orderServer struct {
	*httptest.Server
	client *http.Client
	runs   atomic.Int64 // handler executions
	onRun  func()       // called at each execution when set
}

type orderRequest struct {
	Item string `json:"item"`
	// HoldMS keeps the transaction open that long after the insert, so
	// that duplicates arrive while it runs.
	HoldMS int `json:"hold_ms"`
}

// newOrderServer serves the handler protected with opts; nested wraps it
// twice, the outer layer without options (a global install plus a
// per-route one). A handler whose context carries no transaction (leased
// mode) inserts its row in a transaction of its own (Fixture.CallerManaged).
func newOrderServer(t *testing.T, f Fixture, nested bool, opts ...core.RouteOption) *orderServer {
	t.Helper()
	return newOrderServerWith(t, f, nested, nil, opts...)
}

// newOrderServerWith is newOrderServer calling onRun (when not nil) at
// each execution.
func newOrderServerWith(t *testing.T, f Fixture, nested bool, onRun func(), opts ...core.RouteOption) *orderServer {
	t.Helper()
	// Decisions are logged at Info (every 409 of a storm): keep warnings.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	s := &orderServer{onRun: onRun}
	mux := http.NewServeMux()
	protected := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		if s.onRun != nil {
			s.onRun()
		}
		var in orderRequest
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		insert := f.Insert
		if !f.Store.InTx(ctx) {
			insert = func(ctx context.Context, name string) error {
				return f.CallerManaged(ctx, func(ctx context.Context) error { return f.Insert(ctx, name) })
			}
		}
		if err := insert(ctx, in.Item); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // rolled back, released
			return
		}
		if in.HoldMS > 0 {
			time.Sleep(time.Duration(in.HoldMS) * time.Millisecond)
		}
		var id [8]byte
		_, _ = rand.Read(id[:])
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":"or_%s","item":%q}`, hex.EncodeToString(id[:]), in.Item)
	}), opts...)
	if nested {
		protected = e.Handler(protected)
	}
	mux.Handle("POST /orders", protected)
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	s.client = &http.Client{
		Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256},
		Timeout:   failsafe + 5*time.Second,
	}
	t.Cleanup(s.client.CloseIdleConnections)
	return s
}

func orderBody(item string, holdMS int) string {
	b, _ := json.Marshal(orderRequest{Item: item, HoldMS: holdMS})
	return string(b)
}

// RunExactlyOnce is the acceptance test of docs/contract.md, section 3
// ("What a client observes"), over real
// HTTP: one request (same key, same body) is sent 50 times concurrently,
// then 50 times sequentially, to a handler in middleware-managed atomic
// mode that inserts a business row through the shared transaction. Exactly
// one business row exists and the handler ran once; every 201 carries the
// same body and content type (one execution, the rest replays); an
// in-flight duplicate may get 409 with Retry-After (reject policy, the
// default) and nothing else; with core.WaitInFlight every answer is the
// 201. Every sequential request, after the storm, gets the 201 replay.
//
// The nested variants protect the handler twice (an outer layer without
// options around the route's own, as a global plus a per-route install):
// the inner layer must take over (the outer's transaction rolled back,
// never joined), in atomic mode and with an inner Leased, and nothing may
// differ from a single layer. (Only the reject policy: the outer layer,
// without WaitInFlight, answers a duplicate it meets 409 itself.)
func RunExactlyOnce(t *testing.T, cfg Config) {
	for _, p := range []struct {
		name   string
		nested bool
		opts   []core.RouteOption
	}{
		{"reject", false, nil},
		{"wait", false, []core.RouteOption{core.WaitInFlight(failsafe)}},
		{"nested", true, nil},
		{"nested leased", true, []core.RouteOption{core.Leased()}},
	} {
		t.Run(p.name, func(t *testing.T) { exactlyOnce(t, cfg, p.nested, p.opts) })
	}
}

func exactlyOnce(t *testing.T, cfg Config, nested bool, opts []core.RouteOption) {
	const (
		concurrent = 50
		sequential = 50
		holdMS     = 100
	)
	f := cfg.New(t)
	srv := newOrderServer(t, f, nested, opts...)
	waits := !nested && len(opts) > 0
	ctx := ctxT(t)
	warm(t, f.DB, concurrent)
	key, body := "exactly-once-"+Table(), orderBody("exactly-once", holdMS)
	url := srv.URL + "/orders"

	answers := make([]answer, concurrent)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range answers {
		wg.Go(func() {
			<-gate
			answers[i] = post(ctx, srv.client, url, key, body)
		})
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	storm := time.Since(start)

	var (
		first                        *answer
		executed, replayed, conflict int
		slowest409                   time.Duration
	)
	check201 := func(what string, a answer) {
		if first == nil {
			first = &a
			return
		}
		if !bytes.Equal(a.body, first.body) || a.contentType != first.contentType {
			t.Errorf("%s: 201 %q (%s), but another 201 was %q (%s)", what, a.body, a.contentType, first.body, first.contentType)
		}
	}
	for i, a := range answers {
		what := fmt.Sprintf("concurrent request %d", i)
		switch {
		case a.err != nil:
			t.Errorf("%s: %v", what, a.err)
		case a.status == http.StatusCreated:
			check201(what, a)
			if a.replayed {
				replayed++
			} else {
				executed++
			}
		case a.status == http.StatusConflict && !waits:
			conflict++
			slowest409 = max(slowest409, a.latency)
			if a.retryAfter == "" || !strings.HasPrefix(a.contentType, "application/problem+json") {
				t.Errorf("%s: 409 without Retry-After or problem document: %v", what, a)
			}
		default:
			t.Errorf("%s: %v, want 201%s", what, a, map[bool]string{false: " or 409", true: ""}[waits])
		}
	}
	if first == nil {
		t.Fatalf("no 201 among %d concurrent requests", concurrent)
	}
	if executed != 1 {
		t.Errorf("%d concurrent answers executed the handler (201 without %s), want 1", executed, core.HeaderReplayed)
	}
	seqLat := make([]time.Duration, 0, sequential)
	for i := range sequential {
		a := post(ctx, srv.client, url, key, body)
		what := fmt.Sprintf("sequential request %d", i)
		if a.err != nil || a.status != http.StatusCreated || !a.replayed {
			t.Errorf("%s: %v, want the 201 replay", what, a)
			continue
		}
		check201(what, a)
		seqLat = append(seqLat, a.latency)
	}
	if n := f.Count(t, "exactly-once"); n != 1 {
		t.Errorf("%d business rows, want exactly 1", n)
	}
	if n := srv.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	t.Logf("%v: %d concurrent in %v: 1 executed, %d replayed, %d in progress (409, slowest %v); %d sequential replays: %s",
		cfg.Dialect, concurrent, storm.Round(time.Millisecond), replayed, conflict, slowest409.Round(time.Millisecond), len(seqLat), spread(seqLat))
}

// warm opens n connections of db at once and keeps them idle, so that a
// storm of n requests measures the store, not the opening of connections
// (slow for Postgres under -race on a small machine).
func warm(t testing.TB, db *sql.DB, n int) {
	t.Helper()
	if db == nil {
		return
	}
	db.SetMaxIdleConns(n)
	conns := make([]*sql.Conn, n)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), failsafe)
			defer cancel()
			c, err := db.Conn(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			conns[i] = c
		})
	}
	wg.Wait()
	for _, c := range conns {
		if c != nil {
			_ = c.Close()
		}
	}
}

// settleWindow bounds how long a retry after a failed end of a
// transaction may still meet the dead transaction's claim: a session the
// database killed, or a connection the driver dropped on a cancelled
// commit, is rolled back by the server a moment later, and until then its
// lock makes a claim of the same key answer 409 in-progress.
const settleWindow = 5 * time.Second

// postAfterEnd is post for the retry of a request whose transaction failed
// to end: it sends again, as a client honouring Retry-After would (but
// without waiting the whole second), while the answer is a 409 in-progress
// problem and settleWindow has not passed. A 409 that outlasts the window
// is returned: the claim outlived its transaction.
func postAfterEnd(ctx context.Context, c *http.Client, url, key, body string) answer {
	deadline := time.Now().Add(settleWindow)
	for {
		a := post(ctx, c, url, key, body)
		if a.err != nil || a.status != http.StatusConflict || problemType(a) != "in-progress" || time.Now().After(deadline) {
			return a
		}
		time.Sleep(20 * time.Millisecond)
	}
}
