package sqlstoretest

import (
	"context"
	"crypto/rand"
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
	"github.com/idemkit/idem/sqlstore"
)

// withinServer is a real HTTP service that owns its transaction: every
// POST /orders runs through core.Route.Within with the fixture's
// CallerManaged as the service's TxFunc (database/sql's BeginTx and
// Commit for sqlstore, GORM's db.Transaction for gormstore); its handler
// inserts one business row through the transaction and answers with a
// body no second execution could repeat.
type withinServer struct {
	*httptest.Server
	client *http.Client
	runs   atomic.Int64
	// cancelCommit: the service's transaction is cancelled between the
	// handler and the commit, so the commit fails (database/sql returns
	// the context's error and rolls back).
	cancelCommit atomic.Bool
	// retryCommit: a TxFunc that runs its transaction again, body
	// included, when the commit fails (a serialization failure's retry
	// loop): a misuse that Within refuses.
	retryCommit atomic.Bool
	// beforeAnswer is called when the first byte of an answer is written
	// to the client (the status), when set.
	beforeAnswer func(item string)
	// hold, when set, keeps the handler's transaction open after the
	// insert until it is closed (see holdOpen); atomic, as it is set
	// while the server runs.
	hold atomic.Pointer[chan struct{}]
}

// holdOpen makes s's handlers keep their transaction open after the
// insert until the returned release is called (once, or again: it is
// idempotent). The test's cleanup releases them before the server's
// Close, which waits for them.
func (s *withinServer) holdOpen(t *testing.T) (release func()) {
	hold := make(chan struct{})
	s.hold.Store(&hold)
	release = sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)
	return release
}

type withinRequest struct {
	Item   string `json:"item"`
	HoldMS int    `json:"hold_ms,omitempty"` // keep the transaction open that long after the insert
	Status int    `json:"status,omitempty"`  // answer this status after the insert (default 201)
	Effect bool   `json:"effect,omitempty"`  // call core.MarkEffect before the insert (an external call goes out)
	Twice  bool   `json:"twice,omitempty"`   // insert Item into the unique table twice and answer the second's failure with 409
}

func withinBody(r withinRequest) string {
	b, _ := json.Marshal(r)
	return string(b)
}

func newWithinServer(t *testing.T, f Fixture) *withinServer {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))
	e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	s := &withinServer{}
	route := e.Route()
	once := func(ctx context.Context, body func(context.Context) error) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		return f.CallerManaged(ctx, func(ctx context.Context) error {
			if err := body(ctx); err != nil {
				return err
			}
			if s.cancelCommit.Load() {
				cancel()
			}
			return nil
		})
	}
	inTx := func(ctx context.Context, body func(context.Context) error) error {
		err := once(ctx, body)
		if err != nil && s.retryCommit.Load() {
			err = once(ctx, body)
		}
		return err
	}
	handler := func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		var in withinRequest
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if in.Effect {
			if err := core.MarkEffect(r.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		if in.Twice {
			if err := f.Unique(r.Context(), in.Item); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if err := f.Unique(r.Context(), in.Item); err != nil {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusConflict)
				fmt.Fprintf(w, `{"error":"duplicate","item":%q}`, in.Item)
				return
			}
		}
		if err := f.Insert(r.Context(), in.Item); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if in.HoldMS > 0 {
			time.Sleep(time.Duration(in.HoldMS) * time.Millisecond)
		}
		if hold := s.hold.Load(); hold != nil {
			<-*hold
		}
		status := in.Status
		if status == 0 {
			status = http.StatusCreated
		}
		var id [8]byte
		_, _ = rand.Read(id[:])
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"order":"or_%s","item":%q}`, hex.EncodeToString(id[:]), in.Item)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		if s.beforeAnswer != nil {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(string(body)))
			var in withinRequest
			_ = json.Unmarshal(body, &in)
			w = &firstWrite{ResponseWriter: w, fn: func() { s.beforeAnswer(in.Item) }}
		}
		route.Within(w, r, inTx, handler)
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	s.client = &http.Client{Transport: &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}, Timeout: failsafe + 5*time.Second}
	t.Cleanup(s.client.CloseIdleConnections)
	return s
}

// firstWrite calls fn before the status goes out.
type firstWrite struct {
	http.ResponseWriter
	fn   func()
	once sync.Once
}

func (w *firstWrite) WriteHeader(code int) { w.once.Do(w.fn); w.ResponseWriter.WriteHeader(code) }
func (w *firstWrite) Write(p []byte) (int, error) {
	w.once.Do(w.fn)
	return w.ResponseWriter.Write(p)
}

// RunWithin runs core.Route.Within, the HTTP path of a service that owns
// its transaction, against cfg's store, with the fixture's CallerManaged
// as the service's transaction: one execution and one business row among
// concurrent duplicates; the answer only after the commit; a commit that
// fails records nothing; a 5xx rolls the service's writes back and
// releases the key; a reused key gets the library's 422 problem document
// and a missing key its 400.
func RunWithin(t *testing.T, cfg Config) {
	t.Run("ExactlyOnce", func(t *testing.T) { withinExactlyOnce(t, cfg) })
	t.Run("InFlightAtOnce", func(t *testing.T) { withinInFlight(t, cfg) })
	t.Run("AnswerAfterCommit", func(t *testing.T) { withinAfterCommit(t, cfg) })
	t.Run("CommitFailsRecordsNothing", func(t *testing.T) { withinCommitFails(t, cfg) })
	t.Run("CommitFailsAfterEffect", func(t *testing.T) { withinCommitFailsAfterEffect(t, cfg) })
	t.Run("BodyRetriedAfterEffect", func(t *testing.T) { withinBodyRetriedAfterEffect(t, cfg) })
	t.Run("FailedStatement", func(t *testing.T) { withinFailedStatement(t, cfg) })
	t.Run("ServerErrorRollsBack", func(t *testing.T) { withinServerError(t, cfg) })
	t.Run("Problems", func(t *testing.T) { withinProblems(t, cfg) })
}

func withinExactlyOnce(t *testing.T, cfg Config) {
	const concurrent, sequential = 20, 10
	f := cfg.New(t)
	srv := newWithinServer(t, f)
	warm(t, f.DB, concurrent)
	ctx := ctxT(t)
	key, body := "within-"+Table(), withinBody(withinRequest{Item: "within", HoldMS: 100})
	answers := make([]answer, concurrent)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range answers {
		wg.Go(func() {
			<-gate
			answers[i] = post(ctx, srv.client, srv.URL+"/orders", key, body)
		})
	}
	close(gate)
	wg.Wait()
	var first *answer
	executed := 0
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.Errorf("concurrent request %d: %v", i, a.err)
		case a.status == http.StatusCreated:
			if !a.replayed {
				executed++
			}
			if first == nil {
				first = &answers[i]
			} else if string(a.body) != string(first.body) {
				t.Errorf("concurrent request %d: 201 %q, another 201 was %q", i, a.body, first.body)
			}
		case a.status == http.StatusConflict:
			if a.retryAfter == "" || !strings.HasPrefix(a.contentType, "application/problem+json") {
				t.Errorf("concurrent request %d: 409 without Retry-After or problem document: %v", i, a)
			}
		default:
			t.Errorf("concurrent request %d: %v, want 201 or 409", i, a)
		}
	}
	if executed != 1 {
		t.Errorf("%d concurrent answers executed the handler, want 1", executed)
	}
	for i := range sequential {
		a := post(ctx, srv.client, srv.URL+"/orders", key, body)
		if a.err != nil || a.status != http.StatusCreated || !a.replayed || (first != nil && string(a.body) != string(first.body)) {
			t.Errorf("sequential request %d: %v, want the 201 replay", i, a)
		}
	}
	if n := f.Count(t, "within"); n != 1 {
		t.Errorf("%d business rows, want exactly 1", n)
	}
	if n := srv.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}

// inFlightBound is how soon a duplicate of a request whose transaction is
// open must be answered (the contract says 409 within 100 ms; this leaves
// room for a loaded machine, and stays far below the 1 s minimum of
// MySQL's innodb_lock_wait_timeout, so a claim that waits for a lock
// cannot pass it).
const inFlightBound = 500 * time.Millisecond

// withinInFlight: a duplicate of a request whose service transaction is
// still open (its handler holds it until the duplicate has answered) is
// answered 409 in progress with Retry-After at once, never after waiting
// for the first's transaction (on MySQL/MariaDB an INSERT of an id another
// open transaction inserted waits for it, holding a pooled connection);
// the first then commits and a retry replays it. SQLite, whose
// transactions take its one write lock at BEGIN, cannot tell a duplicate
// before the first commits: there the duplicate waits, then replays.
func withinInFlight(t *testing.T, cfg Config) {
	f := cfg.New(t)
	warm(t, f.DB, 2) // the duplicate's connection is not the one the first holds
	srv := newWithinServer(t, f)
	release := srv.holdOpen(t)
	ctx := ctxT(t)
	key, body := "within-inflight-"+Table(), withinBody(withinRequest{Item: "within-inflight"})
	firstCh := make(chan answer, 1)
	go func() { firstCh <- post(ctx, srv.client, srv.URL+"/orders", key, body) }()
	deadline := time.Now().Add(failsafe)
	for srv.runs.Load() == 0 { // the handler runs once the claim is made
		select {
		case a := <-firstCh:
			t.Fatalf("the first request answered before its handler ran: %v", a)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the first request's handler did not run")
		}
		time.Sleep(5 * time.Millisecond)
	}
	dupCh := make(chan answer, 1)
	go func() { dupCh <- post(ctx, srv.client, srv.URL+"/orders", key, body) }()
	var dup answer
	if cfg.Dialect == sqlstore.SQLite {
		select {
		case dup = <-dupCh:
			t.Fatalf("SQLite: the duplicate answered while the first holds the write lock: %v", dup)
		case <-time.After(300 * time.Millisecond):
		}
		release()
		if dup = <-dupCh; dup.err != nil || dup.status != http.StatusCreated || !dup.replayed {
			t.Errorf("SQLite: the duplicate: %v, want the first's 201 replayed once it committed", dup)
		}
	} else {
		select {
		case dup = <-dupCh:
		case <-time.After(failsafe / 2):
			release()
			t.Fatalf("%v: the duplicate was not answered while the first's transaction stayed open %v: it waits for it", cfg.Dialect, failsafe/2)
		}
		release()
		switch {
		case dup.err != nil || dup.status != http.StatusConflict || dup.retryAfter == "" || !strings.HasPrefix(dup.contentType, "application/problem+json"):
			t.Errorf("%v: the duplicate while the first's transaction is open: %v, want a 409 in-progress problem with Retry-After", cfg.Dialect, dup)
		case dup.latency > inFlightBound:
			t.Errorf("%v: the duplicate was answered after %v, want at once (under %v)", cfg.Dialect, dup.latency, inFlightBound)
		}
	}
	first := <-firstCh
	if first.err != nil || first.status != http.StatusCreated || first.replayed {
		t.Fatalf("first request: %v, want 201", first)
	}
	if again := post(ctx, srv.client, srv.URL+"/orders", key, body); again.err != nil || again.status != http.StatusCreated || !again.replayed || string(again.body) != string(first.body) {
		t.Errorf("retry after the first committed: %v, want its 201 replayed", again)
	}
	if n := srv.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	t.Logf("%v: duplicate answered %d in %v", cfg.Dialect, dup.status, dup.latency.Round(time.Millisecond))
}

// withinAfterCommit: when the first byte of the answer goes out, the
// business row is committed (another connection counts it).
func withinAfterCommit(t *testing.T, cfg Config) {
	f := cfg.New(t)
	srv := newWithinServer(t, f)
	var seen atomic.Int64
	seen.Store(-1)
	srv.beforeAnswer = func(item string) { seen.Store(int64(f.Count(t, item))) }
	a := post(ctxT(t), srv.client, srv.URL+"/orders", "after-commit", withinBody(withinRequest{Item: "after-commit"}))
	if a.err != nil || a.status != http.StatusCreated || a.replayed {
		t.Fatalf("first request: %v, want 201", a)
	}
	if n := seen.Load(); n != 1 {
		t.Errorf("when the answer went out, %d business rows were committed, want 1", n)
	}
}

func withinCommitFails(t *testing.T, cfg Config) {
	f := cfg.New(t)
	srv := newWithinServer(t, f)
	ctx := ctxT(t)
	body := withinBody(withinRequest{Item: "commit-fails"})
	srv.cancelCommit.Store(true)
	a := post(ctx, srv.client, srv.URL+"/orders", "commit-fails", body)
	if a.err != nil || a.status != http.StatusServiceUnavailable || a.retryAfter == "" || !strings.HasPrefix(a.contentType, "application/problem+json") || strings.Contains(string(a.body), "or_") {
		t.Fatalf("commit failed: %v, want a 503 problem document with Retry-After and nothing of the handler's answer", a)
	}
	if n := f.Count(t, "commit-fails"); n != 0 {
		t.Errorf("%d business rows after the failed commit, want 0", n)
	}
	srv.cancelCommit.Store(false)
	retry := postAfterEnd(ctx, srv.client, srv.URL+"/orders", "commit-fails", body)
	if retry.err != nil || retry.status != http.StatusCreated || retry.replayed {
		t.Fatalf("retry: %v, want the handler's 201 (nothing was recorded)", retry)
	}
	if n := f.Count(t, "commit-fails"); n != 1 {
		t.Errorf("%d business rows after the retry, want 1", n)
	}
	if n := srv.runs.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2", n)
	}
}

// withinCommitFailsAfterEffect: the commit fails after the handler marked
// an external effect: the outcome is recorded as indeterminate in a
// transaction of the engine's own, the client gets 500 outcome-unknown,
// and the retry replays it without running the handler.
func withinCommitFailsAfterEffect(t *testing.T, cfg Config) {
	f := cfg.New(t)
	srv := newWithinServer(t, f)
	ctx := ctxT(t)
	body := withinBody(withinRequest{Item: "after-effect", Effect: true})
	srv.cancelCommit.Store(true)
	a := post(ctx, srv.client, srv.URL+"/orders", "after-effect", body)
	if a.err != nil || a.status != http.StatusInternalServerError || !strings.Contains(string(a.body), "outcome-unknown") || strings.Contains(string(a.body), "or_") {
		t.Fatalf("commit failed after the effect: %v, want the 500 outcome-unknown problem", a)
	}
	srv.cancelCommit.Store(false)
	retry := post(ctx, srv.client, srv.URL+"/orders", "after-effect", body)
	if retry.err != nil || retry.status != http.StatusInternalServerError || !retry.replayed || !strings.Contains(string(retry.body), "outcome-unknown") {
		t.Errorf("retry: %v, want the 500 outcome-unknown replay", retry)
	}
	if n := f.Count(t, "after-effect"); n != 0 {
		t.Errorf("%d business rows, want 0 (the commit failed)", n)
	}
	if n := srv.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}

// withinBodyRetriedAfterEffect: the service's TxFunc runs body again when
// the commit fails (a retry loop), after the handler's MarkEffect (the
// card was charged). The second call is refused (500 not-protected), and
// the first attempt is settled from the record as any failed commit after
// MarkEffect is: indeterminate, so the retry gets the 500 outcome-unknown
// replay and the handler runs once.
func withinBodyRetriedAfterEffect(t *testing.T, cfg Config) {
	f := cfg.New(t)
	srv := newWithinServer(t, f)
	ctx := ctxT(t)
	body := withinBody(withinRequest{Item: "retried-body", Effect: true})
	srv.cancelCommit.Store(true)
	srv.retryCommit.Store(true)
	a := post(ctx, srv.client, srv.URL+"/orders", "retried-body", body)
	if a.err != nil || a.status != http.StatusInternalServerError || !strings.Contains(string(a.body), "not-protected") {
		t.Fatalf("body called again after the failed commit: %v, want the 500 not-protected problem", a)
	}
	srv.cancelCommit.Store(false)
	srv.retryCommit.Store(false)
	retry := post(ctx, srv.client, srv.URL+"/orders", "retried-body", body)
	if retry.err != nil || retry.status != http.StatusInternalServerError || !retry.replayed || !strings.Contains(string(retry.body), "outcome-unknown") {
		t.Errorf("retry: %v, want the 500 outcome-unknown replay", retry)
	}
	if n := srv.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1 (the card charged twice)", n)
	}
}

// withinFailedStatement: the handler's statement fails (a unique
// violation) and it answers 409; on Postgres that aborts the service's
// transaction before the completion. On every database the client gets
// the handler's 409 and the retry its replay; the handler runs once.
func withinFailedStatement(t *testing.T, cfg Config) {
	f := cfg.New(t)
	if f.Unique == nil {
		t.Fatal("the fixture has no Unique")
	}
	srv := newWithinServer(t, f)
	ctx := ctxT(t)
	body := withinBody(withinRequest{Item: "failed-statement", Twice: true})
	a := post(ctx, srv.client, srv.URL+"/orders", "failed-statement", body)
	want := `{"error":"duplicate","item":"failed-statement"}`
	if a.err != nil || a.status != http.StatusConflict || a.replayed || string(a.body) != want {
		t.Fatalf("first request: %v, want the handler's 409 %s", a, want)
	}
	retry := post(ctx, srv.client, srv.URL+"/orders", "failed-statement", body)
	if retry.err != nil || retry.status != http.StatusConflict || !retry.replayed || string(retry.body) != want {
		t.Errorf("retry: %v, want the 409 replayed", retry)
	}
	if n := srv.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}

func withinServerError(t *testing.T, cfg Config) {
	f := cfg.New(t)
	srv := newWithinServer(t, f)
	ctx := ctxT(t)
	// The handler inserts its row, then answers 503: the row rolls back
	// and the key is free again, so the same request runs again.
	a := post(ctx, srv.client, srv.URL+"/orders", "five-hundred", withinBody(withinRequest{Item: "five-hundred", Status: http.StatusServiceUnavailable}))
	if a.err != nil || a.status != http.StatusServiceUnavailable || a.replayed || !strings.Contains(string(a.body), "or_") {
		t.Fatalf("first request: %v, want the handler's 503", a)
	}
	if n := f.Count(t, "five-hundred"); n != 0 {
		t.Errorf("%d business rows after the 503, want 0 (rolled back)", n)
	}
	again := post(ctx, srv.client, srv.URL+"/orders", "five-hundred", withinBody(withinRequest{Item: "five-hundred", Status: http.StatusServiceUnavailable}))
	if again.err != nil || again.status != http.StatusServiceUnavailable || again.replayed || string(again.body) == string(a.body) {
		t.Fatalf("retry: %v, want the handler's own new 503 (released)", again)
	}
	if n := srv.runs.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2", n)
	}
}

func withinProblems(t *testing.T, cfg Config) {
	f := cfg.New(t)
	srv := newWithinServer(t, f)
	ctx := ctxT(t)
	first := post(ctx, srv.client, srv.URL+"/orders", "reused", withinBody(withinRequest{Item: "reused"}))
	if first.err != nil || first.status != http.StatusCreated {
		t.Fatalf("first request: %v, want 201", first)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	mismatch := post(ctx, srv.client, srv.URL+"/orders", "reused", withinBody(withinRequest{Item: "other"}))
	if err := json.Unmarshal(mismatch.body, &p); err != nil || mismatch.status != http.StatusUnprocessableEntity || p.Status != 422 ||
		!strings.HasSuffix(p.Type, "key-reused") || !strings.HasPrefix(mismatch.contentType, "application/problem+json") {
		t.Errorf("reused key: %v, want the 422 key-reused problem document", mismatch)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(withinBody(withinRequest{Item: "no-key"})))
	resp, err := srv.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	p.Type = ""
	if err := json.Unmarshal(b, &p); err != nil || resp.StatusCode != http.StatusBadRequest || !strings.HasSuffix(p.Type, "missing-key") {
		t.Errorf("no key: %d %q, want the 400 missing-key problem document", resp.StatusCode, b)
	}
	if n := f.Count(t, "other") + f.Count(t, "no-key"); n != 0 {
		t.Errorf("%d business rows of rejected requests, want 0", n)
	}
	if n := srv.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}
