package pgxstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/sqlmeasure"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// failsafe bounds a wait that must end.
const failsafe = 10 * time.Second

// roundTrips counts the round trips a pool makes: a round trip starts with
// the first write after a read (or the first write at all).
type roundTrips struct {
	mu      sync.Mutex
	n       int
	writing map[net.Conn]bool
}

func (c *roundTrips) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

type countedConn struct {
	net.Conn
	c *roundTrips
}

func (cc countedConn) Write(b []byte) (int, error) {
	cc.c.mu.Lock()
	if !cc.c.writing[cc.Conn] {
		cc.c.n++
		cc.c.writing[cc.Conn] = true
	}
	cc.c.mu.Unlock()
	return cc.Conn.Write(b)
}

func (cc countedConn) Read(b []byte) (int, error) {
	n, err := cc.Conn.Read(b)
	cc.c.mu.Lock()
	cc.c.writing[cc.Conn] = false
	cc.c.mu.Unlock()
	return n, err
}

// countedPool is a pool of one connection whose round trips rt counts. It
// never pings on acquire, so every round trip is a statement's.
func countedPool(t *testing.T) (*pgxpool.Pool, *roundTrips) {
	rt := &roundTrips{writing: map[net.Conn]bool{}}
	pool := openPool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns, cfg.MinConns = 1, 0
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countedConn{c, rt}, nil
		}
	})
	return pool, rt
}

// payment is the realistic four-statement transaction of issue 15: lock
// the order row, insert the payment, update the order, insert an outbox
// row.
type payment struct {
	orders, payments, outbox string
	seq                      *atomic.Int64 // picks the order: 1 to 100 in turn
}

// order picks the next order, so concurrent payments lock different rows.
func (p payment) order() int { return 1 + int(p.seq.Add(1)%100) }

func newPayment(t *testing.T, pool *pgxpool.Pool, prefix string) payment {
	return newPaymentTB(t, pool, prefix)
}

func newPaymentTB(t testing.TB, pool *pgxpool.Pool, prefix string) payment {
	p := payment{prefix + "_orders", prefix + "_payments", prefix + "_outbox", new(atomic.Int64)}
	ctx := context.Background()
	for _, ddl := range []string{
		"CREATE TABLE " + p.orders + " (id BIGINT PRIMARY KEY, amount BIGINT NOT NULL, paid BOOLEAN NOT NULL DEFAULT FALSE)",
		"CREATE TABLE " + p.payments + " (order_id BIGINT NOT NULL, amount BIGINT NOT NULL)",
		"CREATE TABLE " + p.outbox + " (topic TEXT NOT NULL, payload TEXT NOT NULL)",
		"INSERT INTO " + p.orders + " (id, amount) SELECT g, 100 * g FROM generate_series(1, 100) g",
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+p.orders+", "+p.payments+", "+p.outbox)
	})
	return p
}

// run is the handler's work on tx: four statements, four round trips.
func (p payment) run(ctx context.Context, tx pgx.Tx, order int) error {
	var amount int64
	if err := tx.QueryRow(ctx, "SELECT amount FROM "+p.orders+" WHERE id = $1 FOR UPDATE", order).Scan(&amount); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+p.payments+" (order_id, amount) VALUES ($1, $2)", order, amount); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "UPDATE "+p.orders+" SET paid = TRUE WHERE id = $1", order); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+p.outbox+" (topic, payload) VALUES ('payment', $1)", fmt.Sprint(order))
	return err
}

// serveHTTP is the payment route's handler: the payment in the request's
// transaction (pgxstore.Tx), then 201.
func (p payment) serveHTTP(w http.ResponseWriter, r *http.Request) {
	tx, err := pgxstore.Tx(r.Context())
	if err == nil {
		err = p.run(r.Context(), tx, p.order())
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// protectedPayment is the payment route in middleware-managed atomic mode;
// hold, when not nil, is waited for inside the handler.
func protectedPayment(t *testing.T, s *pgxstore.Store, p payment, hold <-chan struct{}, entered chan<- struct{}) http.Handler {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := core.New(s, core.WithSingleCaller(), core.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	return e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := pgxstore.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if entered != nil {
			entered <- struct{}{}
		}
		if hold != nil {
			<-hold
		}
		if err := p.run(r.Context(), tx, p.order()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"paid":7}`)
	}))
}

func serve(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"order":7}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestRoundTrips: the claim travels with BEGIN and the completion with
// COMMIT, so a protected first execution of the four-statement payment
// makes exactly as many round trips as the unprotected transaction (six:
// BEGIN, four statements, COMMIT). The INSERT returns nothing and nothing
// reads behind it: a replay makes two round trips (BEGIN and the INSERT
// that inserts nothing; the read), and a duplicate from another process
// while the first one runs three (the read finds no committed row: the
// claim statement, whose lock probe fails). The ROLLBACK of their
// read-only transaction runs after the answer, off the request's path:
// held here to prove it.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	setup, _, _ := newStore(t)
	pool, rt := countedPool(t)
	s, err := pgxstore.New(pool, pgxstore.WithTable(setup.Table()))
	if err != nil {
		t.Fatal(err)
	}
	p := newPayment(t, pool, setup.Table())
	// The counted pools have one connection, which a held rollback keeps:
	// every hold is released at cleanup, registered after the pools and
	// the tables, so it runs before their Close and DROPs (release is
	// once-only).
	release, wait := pgxstore.HoldRollbacks(s)
	t.Cleanup(release)
	unprotected := func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return p.run(ctx, tx, 7) })
	}
	h := protectedPayment(t, s, p, nil, nil)

	// Warm the connection's statement cache: every statement is prepared
	// once per connection, protected or not.
	if err := unprotected(); err != nil {
		t.Fatal(err)
	}
	if w := serve(h, "warm"); w.Code != http.StatusCreated {
		t.Fatalf("warm-up: %d %s", w.Code, w.Body)
	}
	if w := serve(h, "warm"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("warm-up replay: %d %s", w.Code, w.Body)
	}
	release()
	wait()

	measure := func(what string, fn func()) int {
		t.Helper()
		before := rt.count()
		fn()
		return rt.count() - before
	}
	base := measure("unprotected", func() {
		if err := unprotected(); err != nil {
			t.Fatal(err)
		}
	})
	if base != 6 {
		t.Fatalf("the unprotected payment made %d round trips, want 6 (BEGIN, 4 statements, COMMIT)", base)
	}
	key := "rt-" + sqlstoretest.Table()
	first := measure("first", func() {
		if w := serve(h, key); w.Code != http.StatusCreated {
			t.Fatalf("first execution: %d %s", w.Code, w.Body)
		}
	})
	if first != base {
		t.Errorf("a protected first execution made %d round trips, the unprotected one %d: want the same", first, base)
	}

	release, wait = pgxstore.HoldRollbacks(s)
	t.Cleanup(release)
	replay := measure("replay", func() {
		if w := serve(h, key); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d %s", w.Code, w.Body)
		}
	})
	if replay != 2 {
		t.Errorf("a replay made %d round trips before its answer, want 2 (BEGIN and the INSERT; the read)", replay)
	}
	release()
	wait()

	// A duplicate from another process while the first execution runs.
	twinPool, twinRT := countedPool(t)
	twin, err := pgxstore.New(twinPool, pgxstore.WithTable(setup.Table()))
	if err != nil {
		t.Fatal(err)
	}
	twinH := protectedPayment(t, twin, p, nil, nil)
	if w := serve(twinH, "twin-warm"); w.Code != http.StatusCreated { // warm its cache
		t.Fatalf("twin warm-up: %d %s", w.Code, w.Body)
	}
	dupTrips := func(key string) int {
		hold, entered := make(chan struct{}), make(chan struct{}, 1)
		free := sync.OnceFunc(func() { close(hold) })
		t.Cleanup(free) // a test that ends early frees the handler, whose open transaction the DROPs would wait for
		held := protectedPayment(t, setup, p, hold, entered)
		done := serveHeld(t, held, key, entered)
		before := twinRT.count()
		if w := serve(twinH, key); w.Code != http.StatusConflict {
			t.Errorf("in-flight duplicate: %d %s, want 409", w.Code, w.Body)
		}
		n := twinRT.count() - before
		free()
		if w := <-done; w.Code != http.StatusCreated {
			t.Fatalf("held first execution: %d %s", w.Code, w.Body)
		}
		return n
	}
	dupTrips("rt-inflight-warm-" + sqlstoretest.Table()) // prepares the read and the claim statement on the twin's connection
	twinRelease, twinWait := pgxstore.HoldRollbacks(twin)
	t.Cleanup(twinRelease)
	if dup := dupTrips("rt-inflight-" + sqlstoretest.Table()); dup != 3 {
		t.Errorf("an in-flight duplicate from another process made %d round trips before its 409, want 3 (BEGIN and the INSERT; the read; the claim statement)", dup)
	}
	twinRelease()
	twinWait()
}

// BenchmarkPayment: the four-statement payment transaction, one request
// at a time, unprotected (pgx.BeginFunc) and protected (middleware-managed
// atomic mode, a new key per request), on one pool. Sequential requests
// are bound by latency, where round trips count:
//
//	go test -run - -bench Payment -count 6 ./
func BenchmarkPayment(b *testing.B) {
	ctx := context.Background()
	setup, pool, _ := newStore(b)
	p := newPaymentTB(b, pool, setup.Table())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := core.New(setup, core.WithSingleCaller(), core.WithLogger(quiet))
	if err != nil {
		b.Fatal(err)
	}
	h := e.Handler(http.HandlerFunc(p.serveHTTP))
	b.Run("unprotected", func(b *testing.B) {
		for b.Loop() {
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return p.run(ctx, tx, p.order()) }); err != nil {
				b.Fatal(err)
			}
		}
	})
	prefix := sqlstoretest.Table()
	b.Run("protected", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			if w := serve(h, fmt.Sprint(prefix, i)); w.Code != http.StatusCreated {
				b.Fatalf("%d %s", w.Code, w.Body)
			}
		}
	})
}

// TestMeasurePayment (a measurement, -stores.measure; nothing asserted):
// the payment transaction unprotected and protected, alternating in
// blocks of 300 requests over 7 rounds, with 1 and with 8 concurrent
// clients on a pool of 40; it logs the median throughput ratio.
func TestMeasurePayment(t *testing.T) {
	if !sqlmeasure.Measure() {
		t.Skip("a measurement: run with -stores.measure")
	}
	ctx := context.Background()
	setup, pool, _ := newStore(t)
	p := newPayment(t, pool, setup.Table())
	h := protectedPayment(t, setup, p, nil, nil)
	prefix := sqlstoretest.Table()
	var n atomic.Int64
	kinds := map[string]func() error{
		"unprotected": func() error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return p.run(ctx, tx, p.order()) })
		},
		"protected": func() error {
			if w := serve(h, fmt.Sprint(prefix, n.Add(1))); w.Code != http.StatusCreated {
				return fmt.Errorf("%d %s", w.Code, w.Body)
			}
			return nil
		},
	}
	const block, rounds = 300, 7
	for _, clients := range []int{1, 8} {
		var ratios []float64
		for round := range rounds {
			rate := map[string]float64{}
			order := []string{"unprotected", "protected"}
			if round%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			for _, kind := range order {
				start := time.Now()
				var wg sync.WaitGroup
				for c := range clients {
					wg.Go(func() {
						for i := c; i < block; i += clients {
							if err := kinds[kind](); err != nil {
								t.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				rate[kind] = block / time.Since(start).Seconds()
			}
			ratios = append(ratios, rate["protected"]/rate["unprotected"])
			t.Logf("clients=%d round %d: unprotected %.0f req/s, protected %.0f req/s (%.0f %%)", clients, round+1, rate["unprotected"], rate["protected"], 100*ratios[len(ratios)-1])
		}
		slices.Sort(ratios)
		t.Logf("clients=%d: median protected/unprotected %.0f %% (min %.0f %%, max %.0f %%)", clients, 100*ratios[rounds/2], 100*ratios[0], 100*ratios[rounds-1])
	}
}

// TestRoundTripsLeased: a leased route (its effects outside the database)
// claims and completes on the pool in autocommit: two round trips for a
// first execution, two for a replay (the INSERT, then the read), and two
// for a duplicate while the first one runs, from this process or another
// (the registry only knows transactions).
func TestRoundTripsLeased(t *testing.T) {
	setup, _, _ := newStore(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	hold, entered := make(chan struct{}), make(chan struct{}, 1)
	var holding atomic.Bool
	handler := func(s *pgxstore.Store) http.Handler {
		e, err := core.New(s, core.WithSingleCaller(), core.WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		return e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if holding.Load() {
				entered <- struct{}{}
				<-hold
			}
			w.WriteHeader(http.StatusCreated)
		}), core.Leased())
	}
	counted := func(warm string) (http.Handler, *roundTrips) {
		pool, rt := countedPool(t)
		s, err := pgxstore.New(pool, pgxstore.WithTable(setup.Table()))
		if err != nil {
			t.Fatal(err)
		}
		h := handler(s)
		if w := serve(h, warm); w.Code != http.StatusCreated { // prepares the statements
			t.Fatalf("warm-up: %d %s", w.Code, w.Body)
		}
		if w := serve(h, warm); w.Header().Get("Idempotent-Replayed") != "true" { // and the read
			t.Fatalf("warm-up replay: %d %s", w.Code, w.Body)
		}
		return h, rt
	}
	h, rt := counted("warm-this")
	other, otherRT := counted("warm-other")
	free := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(free) // after the pools': a test that ends early frees the held handler
	measure := func(rt *roundTrips, fn func()) int {
		before := rt.count()
		fn()
		return rt.count() - before
	}
	key := "leased-" + sqlstoretest.Table()
	if n := measure(rt, func() {
		if w := serve(h, key); w.Code != http.StatusCreated {
			t.Fatalf("first execution: %d %s", w.Code, w.Body)
		}
	}); n != 2 {
		t.Errorf("a leased first execution made %d round trips, want 2 (claim, completion)", n)
	}
	if n := measure(rt, func() {
		if w := serve(h, key); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d %s", w.Code, w.Body)
		}
	}); n != 2 {
		t.Errorf("a leased replay made %d round trips, want 2 (the INSERT, the read)", n)
	}
	holding.Store(true)
	key2 := key + "-inflight"
	done := serveHeld(t, h, key2, entered)
	holding.Store(false)
	for name, c := range map[string]struct {
		h  http.Handler
		rt *roundTrips
	}{"this process": {h, rt}, "another process": {other, otherRT}} {
		if n := measure(c.rt, func() {
			if w := serve(c.h, key2); w.Code != http.StatusConflict {
				t.Errorf("in-flight duplicate from %s: %d %s, want 409", name, w.Code, w.Body)
			}
		}); n != 2 {
			t.Errorf("an in-flight duplicate from %s made %d round trips, want 2 (the INSERT, the read)", name, n)
		}
	}
	free()
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("held first execution: %d %s", w.Code, w.Body)
	}
}

// TestRoundTripsNamed: a route named for the completer (core.Name) writes
// its record's mark in the claim's own statement (store.ClaimRequest.Mark),
// so its first execution makes as many round trips as the same route
// unnamed, in leased and in atomic mode, and the record it leaves
// indeterminate is due for the completer without a statement of its own.
func TestRoundTripsNamed(t *testing.T) {
	setup, _, _ := newStore(t)
	pool, rt := countedPool(t)
	s, err := pgxstore.New(pool, pgxstore.WithTable(setup.Table()))
	if err != nil {
		t.Fatal(err)
	}
	p := newPayment(t, pool, setup.Table())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	named := []core.RouteOption{core.Name("payments"), core.RecordRequest(nil),
		core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) { return core.Resolution{}, nil })}
	for _, leased := range []bool{true, false} {
		mode := map[bool]string{true: "leased", false: "atomic"}[leased]
		t.Run(mode, func(t *testing.T) {
			e, err := core.New(s, core.WithSingleCaller(), core.WithLogger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			// Leased: the charge is marked and its answer lost (502:
			// indeterminate, so the mark stays live). Atomic: the
			// four-statement payment.
			h := func(w http.ResponseWriter, r *http.Request) {
				if leased {
					if err := core.MarkEffect(r.Context()); err != nil {
						t.Error(err)
					}
					w.WriteHeader(http.StatusBadGateway)
					return
				}
				p.serveHTTP(w, r)
			}
			var opts []core.RouteOption
			if leased {
				opts = append(opts, core.Leased())
			}
			plain := e.Handler(http.HandlerFunc(h), opts...)
			marked := e.Handler(http.HandlerFunc(h), append(opts, named...)...)
			want := map[bool]int{true: http.StatusBadGateway, false: http.StatusCreated}[leased]
			trips := func(h http.Handler, key string) int {
				t.Helper()
				before := rt.count()
				if w := serve(h, key); w.Code != want {
					t.Fatalf("%s: %d %s, want %d", key, w.Code, w.Body, want)
				}
				return rt.count() - before
			}
			prefix := mode + "-" + sqlstoretest.Table()
			trips(plain, prefix+"-warm-plain") // prepares the statements
			trips(marked, prefix+"-warm-named")
			unnamed, withName := trips(plain, prefix+"-plain"), trips(marked, prefix+"-named")
			if withName != unnamed {
				t.Errorf("a named route's first execution made %d round trips, the same route unnamed %d: want the same (the mark rides in the claim's statement)", withName, unnamed)
			}
			if !leased {
				return
			}
			due, err := s.Due(context.Background(), time.Now().Add(time.Hour), store.MaxListLimit)
			if err != nil {
				t.Fatal(err)
			}
			found := slices.ContainsFunc(due, func(p store.Pending) bool { return p.Record.Key == prefix+"-named" && p.Mark.Route == "payments" })
			if !found || slices.ContainsFunc(due, func(p store.Pending) bool { return p.Record.Key == prefix+"-plain" }) {
				t.Errorf("Due: %d marks, want the named route's record (found: %v) and not the unnamed one's", len(due), found)
			}
		})
	}
}

// serveHeld serves a first execution of key on h in the background and
// returns once its handler signalled entered; it fails the test when the
// request answers first (it never reached the handler) or nothing happens
// within failsafe. The answer arrives on the channel returned.
func serveHeld(t *testing.T, h http.Handler, key string, entered <-chan struct{}) <-chan *httptest.ResponseRecorder {
	t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- serve(h, key) }()
	select {
	case <-entered:
	case w := <-done:
		t.Fatalf("held first execution answered before its handler: %d %s", w.Code, w.Body)
	case <-time.After(failsafe):
		t.Fatalf("held first execution: its handler did not start within %v", failsafe)
	}
	return done
}
