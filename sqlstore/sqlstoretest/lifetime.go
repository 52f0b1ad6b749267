package sqlstoretest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
)

// RunLifetime runs the HTTP scenarios about what an attempt's record
// outlives, on a real database: a Leased() route under the application's
// transaction-per-request middleware (its record commits on its own
// connection, whatever the request's context carries), and an atomic answer
// far over the recording cap (spilled to a temporary file, committed with
// the record when the handler returns, then sent, with bounded memory).
func RunLifetime(t *testing.T, cfg Config) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, Config)
	}{
		{"ok, leased in the app's transaction: a 5xx after MarkEffect is replayed after the app rolls back", leasedAppRollback},
		{"ok, leased in the app's transaction: a success is recorded even when the app rolls back", leasedAppRollbackSuccess},
		{"ok, leased in the app's transaction: a duplicate from another connection gets 409 while the first runs", leasedAppInFlight},
		{"ok, leased Once in the caller's transaction: the record commits on its own connection", leasedOnceInCallerTx},
		{"ok, leased: the handler's local writes commit with the completion; a fenced attempt's never do", leasedLocalWrites},
		{"ok, leased: local writes whose COMMIT fails are not answered with the handler's 2xx; the key is released", leasedLocalCommitFails},
		{"ok, leased: a handler that commits the attempt's transaction itself gets its answer recorded; a takeover never repeats its writes", leasedLocalHandlerCommit},
		{"ok, leased: a failed statement in the attempt's transaction after MarkEffect records the handler's 4xx", leasedLocalFailedStatement},
		{"ok, atomic: a 50 MiB answer spills past the cap, commits, then streams with bounded memory", atomicStream},
		{"ok, atomic: an export streamed from a cursor of the transaction past the cap reaches the client whole", atomicCursorExport},
		{"ok, atomic: a client that goes away does not end the attempt; a retry meanwhile gets 409, afterwards the replay", atomicClientGone},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, cfg) })
	}
}

// payService is a payment API as an application builds it: a middleware
// that runs every request in a transaction of its own (begun with the
// fixture's CallerManaged: sqlstore.WithTx or gormstore.WithTx), committed
// unless the answer is a 5xx or the request asks for a rollback
// (X-Rollback), and behind it a Leased() route that marks its effect,
// "charges" a provider outside the database (charges), writes its own row
// "app-<key>" in the application's transaction, and answers the status the
// request asks for (X-Status, default 201). hold, when set, is waited for
// after the charge.
type payService struct {
	*httptest.Server
	runs, charges atomic.Int64
	entered       chan struct{}
	hold          chan struct{}
}

func newPayService(t *testing.T, f Fixture, hold bool) *payService {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	s := &payService{entered: make(chan struct{}, 8)}
	if hold {
		s.hold = make(chan struct{})
	}
	pay := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		ctx := r.Context()
		key := r.Header.Get(core.HeaderKey)
		core.MarkEffect(ctx)
		s.charges.Add(1) // the provider charged
		if err := f.Insert(ctx, "app-"+key); err != nil {
			http.Error(w, "the application's transaction is not in the handler's context: "+err.Error(), http.StatusTeapot)
			return
		}
		if s.hold != nil {
			s.entered <- struct{}{}
			<-s.hold
		}
		status := http.StatusCreated
		if v := r.Header.Get("X-Status"); v != "" {
			_, _ = fmt.Sscanf(v, "%d", &status)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"charge":%q,"status":%d}`, key, status)
	}), core.Leased())
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		_ = f.CallerManaged(r.Context(), func(ctx context.Context) error {
			pay.ServeHTTP(sw, r.WithContext(ctx))
			if sw.status >= 500 || r.Header.Get("X-Rollback") != "" {
				return errRollback
			}
			return nil
		})
	})
	s.Server = httptest.NewServer(app)
	t.Cleanup(s.Close)
	if hold {
		// Registered after s.Close, so it runs first: a test that ends
		// early frees the handler it holds, which Close waits for.
		t.Cleanup(func() {
			select {
			case <-s.hold:
			default:
				close(s.hold)
			}
		})
	}
	return s
}

// statusWriter remembers the status the handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (s *payService) pay(t *testing.T, key string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, s.URL+"/payments", strings.NewReader(`{"amount":1999}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(core.HeaderKey, key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	start := time.Now()
	res, err := s.Client().Do(req)
	if err != nil {
		t.Fatalf("POST /payments: %v", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: res.StatusCode, body: b, contentType: res.Header.Get("Content-Type"),
		replayed: res.Header.Get(core.HeaderReplayed) == "true", retryAfter: res.Header.Get("Retry-After"), latency: time.Since(start)}
}

// sqliteRefuses checks SQLite's answer to a leased route inside the
// application's transaction: SQLite admits one writer, and the
// application's transaction (BEGIN IMMEDIATE) holds the write lock, so a
// record committed on its own connection would wait for the very
// transaction that waits for it. The store refuses at once (core.ErrConfig,
// a 500 problem, not a 503 after busy_timeout): the handler does not run
// and nothing is charged.
func sqliteRefuses(t *testing.T, s *payService) {
	t.Helper()
	for range 2 {
		a := s.pay(t, "sqlite-"+Table())
		if a.status != http.StatusInternalServerError || !strings.HasPrefix(a.contentType, "application/problem+json") {
			t.Errorf("SQLite, leased route in the application's transaction: %v, want a problem document refusing it", a)
		}
	}
	if n := s.runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times, want 0 (refused)", n)
	}
}

func leasedAppRollback(t *testing.T, cfg Config) {
	f := cfg.New(t)
	s := newPayService(t, f, false)
	if cfg.Dialect == sqlstore.SQLite {
		sqliteRefuses(t, s)
		return
	}
	key := "rb-" + Table()
	first := s.pay(t, key, "X-Status", "502")
	if first.status != http.StatusBadGateway || first.replayed {
		t.Fatalf("first: %v, want the handler's 502", first)
	}
	for i := range 2 {
		retry := s.pay(t, key)
		if retry.status != http.StatusBadGateway || !retry.replayed || string(retry.body) != string(first.body) {
			t.Errorf("retry %d: %v, want the 502 replayed (indeterminate), never a second charge", i, retry)
		}
	}
	if n := s.charges.Load(); n != 1 {
		t.Errorf("the provider charged %d times, want 1", n)
	}
	if n := f.Count(t, "app-"+key); n != 0 {
		t.Errorf("%d application rows after the application's rollback, want 0", n)
	}
}

func leasedAppRollbackSuccess(t *testing.T, cfg Config) {
	f := cfg.New(t)
	s := newPayService(t, f, false)
	if cfg.Dialect == sqlstore.SQLite {
		sqliteRefuses(t, s)
		return
	}
	key := "ok-" + Table()
	first := s.pay(t, key, "X-Rollback", "1")
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("first: %v, want the handler's 201", first)
	}
	retry := s.pay(t, key)
	if retry.status != http.StatusCreated || !retry.replayed || string(retry.body) != string(first.body) {
		t.Errorf("retry: %v, want the 201 replayed", retry)
	}
	if n := s.charges.Load(); n != 1 {
		t.Errorf("the provider charged %d times, want 1", n)
	}
	if n := f.Count(t, "app-"+key); n != 0 {
		t.Errorf("%d application rows after the application's rollback, want 0 (its own transaction)", n)
	}
}

func leasedAppInFlight(t *testing.T, cfg Config) {
	f := cfg.New(t)
	s := newPayService(t, f, true)
	if cfg.Dialect == sqlstore.SQLite {
		close(s.hold)
		sqliteRefuses(t, s)
		return
	}
	key := "fl-" + Table()
	done := make(chan answer, 1)
	go func() { done <- s.pay(t, key) }()
	select {
	case <-s.entered:
	case <-time.After(failsafe):
		t.Fatal("the first payment did not reach its handler")
	}
	dup := s.pay(t, key)
	if dup.status != http.StatusConflict || dup.retryAfter == "" {
		t.Errorf("duplicate while the first runs: %v, want 409 with Retry-After", dup)
	}
	close(s.hold)
	var first answer
	select {
	case first = <-done:
	case <-time.After(failsafe):
		t.Fatal("the first payment did not answer")
	}
	if first.status != http.StatusCreated {
		t.Fatalf("first: %v, want 201", first)
	}
	retry := s.pay(t, key)
	if retry.status != http.StatusCreated || !retry.replayed || string(retry.body) != string(first.body) {
		t.Errorf("retry: %v, want the 201 replayed", retry)
	}
	if n := s.charges.Load(); n != 1 {
		t.Errorf("the provider charged %d times, want 1", n)
	}
	if n := f.Count(t, "app-"+key); n != 1 {
		t.Errorf("%d application rows, want 1 (committed by the application)", n)
	}
}

// atomicStream: a handler in middleware-managed atomic mode writes its
// business row, then a 50 MiB answer, then a last row on the same
// transaction. Past the recording cap the answer spills to a temporary
// file; the handler keeps its transaction, so the last row succeeds; the
// engine commits (both rows and the record, status 201, body not kept),
// then sends: the client gets every byte, the process allocates far less
// than the answer, and a retry gets the 201 with a response-not-kept
// problem.
func atomicStream(t *testing.T, cfg Config) {
	const size = 50 << 20
	chunk := []byte(strings.Repeat("0123456789abcdef", 4096)) // 64 KiB
	f := cfg.New(t)
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	var lateErr atomic.Value
	srv := httptest.NewServer(e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if err := f.Insert(r.Context(), "export"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/csv")
		w.WriteHeader(http.StatusCreated)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		// The transaction is still open past the cap: a late write succeeds.
		lateErr.Store(fmt.Sprint(f.Insert(r.Context(), "export-late")))
	})))
	t.Cleanup(srv.Close)

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, srv.URL, strings.NewReader(`{"export":"all"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(core.HeaderKey, "export-"+Table())
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// The headers arrived: the business rows are committed.
	if n := f.Count(t, "export"); n != 1 {
		t.Errorf("business rows when the client got the headers: %d, want 1 (committed before anything was sent)", n)
	}
	if n := f.Count(t, "export-late"); n != 1 {
		t.Errorf("late rows when the client got the headers: %d, want 1 (committed with the record)", n)
	}
	got, err := io.Copy(io.Discard, res.Body)
	res.Body.Close()
	runtime.ReadMemStats(&after)
	if err != nil || res.StatusCode != http.StatusCreated || got != size {
		t.Fatalf("the client got %d with %d bytes (%v), want 201 with %d", res.StatusCode, got, err, size)
	}
	const bound = 16 << 20
	if d := after.TotalAlloc - before.TotalAlloc; d > bound {
		t.Errorf("the exchange allocated %d MiB for a %d MiB answer, want under %d MiB", d>>20, size>>20, bound>>20)
	}
	if v, _ := lateErr.Load().(string); v != "<nil>" {
		t.Errorf("a write on the transaction past the cap failed: %s, want nil (the transaction stays open)", v)
	}
	dup, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, srv.URL, strings.NewReader(`{"export":"all"}`))
	if err != nil {
		t.Fatal(err)
	}
	dup.Header.Set(core.HeaderKey, req.Header.Get(core.HeaderKey))
	dres, err := srv.Client().Do(dup)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(dres.Body)
	dres.Body.Close()
	if dres.StatusCode != http.StatusCreated || dres.Header.Get(core.HeaderReplayed) != "true" || !strings.Contains(string(b), "response-not-kept") {
		t.Errorf("retry: %d %s %q, want the 201 replayed with a response-not-kept problem", dres.StatusCode, dres.Header, b)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}

// atomicCursorExport: a handler in middleware-managed atomic mode inserts
// 3000 rows, then streams them back (600 bytes a line, about 1.7 MiB, past
// the 1 MiB recording cap) from a cursor on the same transaction. The
// transaction must stay open until the handler returns: the client gets
// every line with 201, and the rows are committed with the record.
func atomicCursorExport(t *testing.T, cfg Config) {
	const rows, width = 3000, 600
	f := cfg.New(t)
	if f.Stream == nil {
		t.Fatal("the fixture sets no Stream: set Fixture.Stream")
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	var handlerErr atomic.Value
	srv := httptest.NewServer(e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range rows {
			if err := f.Insert(r.Context(), fmt.Sprintf("line-%05d", i)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		pad := strings.Repeat(".", width-len("line-00000")-1)
		err := f.Stream(r.Context(), "line-", func(name string) error {
			_, err := io.WriteString(w, name+pad+"\n")
			return err
		})
		handlerErr.Store(fmt.Sprint(err))
	})))
	t.Cleanup(srv.Close)

	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, srv.URL, strings.NewReader(`{"export":"lines"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(core.HeaderKey, "lines-"+Table())
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if v, _ := handlerErr.Load().(string); v != "<nil>" {
		t.Errorf("the handler's cursor ended with %s, want nil", v)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if err != nil || res.StatusCode != http.StatusCreated || len(b) != rows*width || len(lines) != rows {
		t.Fatalf("the client got %d with %d bytes, %d lines (%v), want 201 with %d bytes, %d lines", res.StatusCode, len(b), len(lines), err, rows*width, rows)
	}
	if last := fmt.Sprintf("line-%05d", rows-1); !strings.HasPrefix(lines[rows-1], last) {
		t.Errorf("the last line starts %.20q, want %q", lines[rows-1], last)
	}
	for _, name := range []string{"line-00000", fmt.Sprintf("line-%05d", rows-1)} {
		if n := f.Count(t, name); n != 1 {
			t.Errorf("%d committed rows %s, want 1", n, name)
		}
	}
}

// lockedBuffer is a log destination tests read while servers write.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// atomicClientGone: in atomic mode an attempt outlives its client, as in
// leased mode: a client that goes away while the handler runs (after
// MarkEffect and a charge at the "provider", or without an effect) neither
// cancels the handler's context nor rolls the transaction back. While the
// first attempt runs, a retry gets 409 (its claim is still held: a retry
// in that window must never charge again); once it ends, the retry
// replays its 201. One business row, one charge, nothing logged at ERROR.
func atomicClientGone(t *testing.T, cfg Config) {
	for _, effect := range []bool{false, true} {
		t.Run(fmt.Sprintf("MarkEffect=%v", effect), func(t *testing.T) {
			f := cfg.New(t)
			logs := new(lockedBuffer)
			e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
			if err != nil {
				t.Fatal(err)
			}
			var runs, charges atomic.Int64
			entered, release := make(chan struct{}, 1), make(chan struct{})
			srv := httptest.NewServer(e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx := r.Context()
				n := runs.Add(1)
				if effect {
					if err := core.MarkEffect(ctx); err != nil {
						t.Error(err)
					}
					charges.Add(1)
				}
				if n == 1 {
					entered <- struct{}{}
					<-release
					if err := ctx.Err(); err != nil {
						t.Errorf("the handler's context ended when its client went away: %v", err)
					}
				}
				if err := f.Insert(ctx, "gone"); err != nil {
					http.Error(w, "could not store the order", http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "order %d", n)
			})))
			t.Cleanup(srv.Close)
			released := false
			defer func() {
				if !released {
					close(release)
				}
			}()

			key := "gone-" + Table()
			send := func() (int, string, string) {
				req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, srv.URL, strings.NewReader(`{"item":"gone"}`))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set(core.HeaderKey, key)
				res, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				return res.StatusCode, string(b), res.Header.Get(core.HeaderReplayed)
			}
			goneClient(t, srv, key, entered)
			// The first attempt still runs: its claim holds the key.
			if code, b, _ := send(); code != http.StatusConflict {
				t.Fatalf("retry while the first attempt runs: %d %q, want 409 (a second execution could charge again)", code, b)
			}
			close(release)
			released = true
			for deadline := time.Now().Add(failsafe); ; time.Sleep(20 * time.Millisecond) {
				code, b, replayed := send()
				if code == http.StatusConflict && time.Now().Before(deadline) {
					continue // the first attempt is committing
				}
				if code != http.StatusCreated || b != "order 1" || replayed != "true" {
					t.Fatalf("retry after the first attempt ended: %d %q (replayed %q), want its 201 replayed", code, b, replayed)
				}
				break
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the handler ran %d times, want 1", n)
			}
			if n := charges.Load(); effect && n != 1 {
				t.Errorf("%d charges, want 1", n)
			}
			if n := f.Count(t, "gone"); n != 1 {
				t.Errorf("%d business rows, want 1", n)
			}
			if strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("the engine logged an error for a client that went away:\n%s", logs)
			}
		})
	}
}

// leasedOnceInCallerTx: a consumer runs Engine.Once with core.Leased()
// inside its own transaction (sqlstore.WithTx, gormstore.WithTx). fn marks
// its effect, charges, writes the consumer's row in the consumer's
// transaction (fn's context carries it) and fails; the consumer rolls
// back. The redelivery must not run fn again: the record, indeterminate,
// was committed on its own connection. SQLite refuses the combination at
// once (core.ErrConfig).
func leasedOnceInCallerTx(t *testing.T, cfg Config) {
	f := cfg.New(t)
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	msg := core.Message{Consumer: "payments", ID: "m-" + Table()}
	deliver := func() error {
		var onceErr error
		_ = f.CallerManaged(ctxT(t), func(ctx context.Context) error {
			_, onceErr = e.Once(ctx, msg, func(ctx context.Context) ([]byte, error) {
				runs.Add(1)
				core.MarkEffect(ctx)
				if err := f.Insert(ctx, "consumer-"+msg.ID); err != nil {
					return nil, fmt.Errorf("the consumer's transaction is not in fn's context: %w", err)
				}
				return nil, errors.New("the provider timed out")
			}, core.Leased())
			return errRollback // the consumer nacks and rolls back
		})
		return onceErr
	}
	first := deliver()
	if cfg.Dialect == sqlstore.SQLite {
		if !errors.Is(first, core.ErrConfig) || runs.Load() != 0 {
			t.Fatalf("SQLite: Once(Leased) in the caller's transaction: %v after %d runs, want ErrConfig before running", first, runs.Load())
		}
		return
	}
	if first == nil || errors.Is(first, core.ErrIndeterminate) {
		t.Fatalf("first delivery: %v, want fn's error", first)
	}
	for i := range 2 {
		if err := deliver(); !errors.Is(err, core.ErrIndeterminate) {
			t.Errorf("redelivery %d: %v, want ErrIndeterminate (fn must not run again)", i, err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times, want 1", n)
	}
	if n := f.Count(t, "consumer-"+msg.ID); n != 0 {
		t.Errorf("%d consumer rows after the rollbacks, want 0", n)
	}
}

// goneClient sends a request with key to srv, waits until the handler
// signalled entered, and goes away (cancels it). It returns once the
// request has failed on the client's side.
func goneClient(t *testing.T, srv *httptest.Server, key string, entered <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"item":"gone"}`))
		if err != nil {
			errc <- err
			return
		}
		req.Header.Set(core.HeaderKey, key)
		res, err := srv.Client().Do(req)
		if err == nil {
			res.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-entered:
	case <-time.After(failsafe):
		t.Fatal("the first request did not reach its handler")
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
}
