package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// --- the store the engine sees ----------------------------------------------

// errDown is what a store that is down answers.
var errDown = errors.New("scenario: dial tcp 10.0.0.1:5432: connect: connection refused")

// hookStore wraps the scenario's memstore: it can be taken down (every
// method fails), and it signals claims that met an in-progress record, so a
// scenario knows that a duplicate is waiting.
type hookStore struct {
	inner   store.Store
	down    atomic.Bool
	failing atomic.Uint32 // ops (opClaim|...) that fail with errSecret
	once    atomic.Uint32 // ops that fail with errSecret the next time only
	commits atomic.Int32  // transactions committed (hookTx.Commit succeeded)
	blocked chan struct{} // one pending signal at most
}

// Store operations a scenario can make fail with errSecret.
const (
	opBegin uint32 = 1 << iota
	opClaim
	opComplete
	opCommit
	opRelease
	opGet
	opExtend
)

// fault is the error op fails with now: errDown when the store is down,
// errSecret when the scenario made op fail, else nil.
func (s *hookStore) fault(op uint32) error {
	if s.down.Load() {
		return errDown
	}
	if s.failing.Load()&op != 0 {
		return errSecret
	}
	if s.once.And(^op)&op != 0 {
		return errSecret
	}
	return nil
}

var _ store.Store = (*hookStore)(nil)

func (s *hookStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := s.fault(opClaim); err != nil {
		return store.ClaimResult{}, err
	}
	res, err := s.inner.Claim(ctx, req)
	if err == nil && !res.Claimed && res.Record.State == store.StateInProgress {
		select {
		case s.blocked <- struct{}{}:
		default:
		}
	}
	return res, err
}

func (s *hookStore) Extend(ctx context.Context, id store.ID, token int64, leaseUntil time.Time) error {
	if err := s.fault(opExtend); err != nil {
		return err
	}
	return s.inner.Extend(ctx, id, token, leaseUntil)
}

func (s *hookStore) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	if err := s.fault(opComplete); err != nil {
		return err
	}
	return s.inner.Complete(ctx, id, token, c)
}

func (s *hookStore) Release(ctx context.Context, id store.ID, token int64) error {
	if err := s.fault(opRelease); err != nil {
		return err
	}
	return s.inner.Release(ctx, id, token)
}

func (s *hookStore) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	if err := s.fault(opGet); err != nil {
		return store.Record{}, err
	}
	return s.inner.Get(ctx, id, now)
}

func (s *hookStore) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	if s.down.Load() {
		return 0, errDown
	}
	return s.inner.DeleteExpired(ctx, now, limit)
}

// hookTxStore is hookStore for atomic mode.
type hookTxStore struct {
	*hookStore
	tx store.TxStore
}

var _ store.TxStore = (*hookTxStore)(nil)

func (s *hookTxStore) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	if err := s.fault(opBegin); err != nil {
		return nil, nil, err
	}
	ctx, tx, err := s.tx.Begin(ctx)
	if err != nil {
		return ctx, tx, err
	}
	return ctx, &hookTx{Tx: tx, s: s.hookStore}, nil
}

// hookTx is a transaction whose Commit can be made to fail (opCommit); it
// then rolls back, as a failed commit does.
type hookTx struct {
	store.Tx
	s *hookStore
}

func (t *hookTx) Commit() error {
	if err := t.s.fault(opCommit); err != nil {
		_ = t.Tx.Rollback()
		return err
	}
	err := t.Tx.Commit()
	if err == nil {
		t.s.commits.Add(1)
	}
	return err
}

func (s *hookTxStore) InTx(ctx context.Context) bool { return s.tx.InTx(ctx) }

func (s *hookTxStore) WithoutTx(ctx context.Context) context.Context { return s.tx.WithoutTx(ctx) }

// --- handlers -----------------------------------------------------------------

// orderHandler counts its executions in n and answers 201 with a JSON body
// naming the execution, the caller and the request body it read, and with
// Content-Type and Location.
func orderHandler(n *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		writeOrder(w, r, int(i))
	}
}

// writeOrder is the answer of orderHandler for execution i.
func writeOrder(w http.ResponseWriter, r *http.Request, i int) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "reading the request body: "+err.Error(), 599)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", i))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d,"caller":%q,"request":%q}`, i, r.Header.Get("X-Caller"), body)
}

// orderBody is the body orderHandler writes for execution i.
func orderBody(i int, caller, request string) string {
	return fmt.Sprintf(`{"order":%d,"caller":%q,"request":%q}`, i, caller, request)
}

// --- assertions -----------------------------------------------------------------

// wantCalls fails unless the handler ran want times.
func wantCalls(t *testing.T, n *atomic.Int32, want int) {
	t.Helper()
	if got := int(n.Load()); got != want {
		t.Errorf("the handler ran %d times, want %d", got, want)
	}
}

// wantStatus fails unless res has the status.
func wantStatus(t *testing.T, res result, status int) {
	t.Helper()
	if res.Status != status {
		t.Fatalf("status %d, want %d; response: %v", res.Status, status, res)
	}
}

// wantOriginal fails unless res is a handler's own answer with status and
// body: not a replay.
func wantOriginal(t *testing.T, res result, status int, body string) {
	t.Helper()
	wantStatus(t, res, status)
	if res.Body != body {
		t.Errorf("body %q, want %q", res.Body, body)
	}
	if v, ok := res.Header[core.HeaderReplayed]; ok {
		t.Errorf("%s: %q on an answer that is not a replay", core.HeaderReplayed, v)
	}
}

// comparedHeaders are the headers a replay must reproduce: the default
// allowlist.
var comparedHeaders = core.DefaultRecordedHeaders

// wantReplay fails unless got replays first: the same status, body and
// recorded headers (every value, in order), plus Idempotent-Replayed: true.
func wantReplay(t *testing.T, first, got result) {
	t.Helper()
	if got.Status != first.Status {
		t.Fatalf("replay status %d, want %d; replay: %v", got.Status, first.Status, got)
	}
	if got.Body != first.Body {
		t.Errorf("replay body %q, want %q", got.Body, first.Body)
	}
	for _, name := range comparedHeaders {
		if a, b := first.Header.Values(name), got.Header.Values(name); !slices.Equal(a, b) {
			t.Errorf("replay %s: %q, want %q", name, b, a)
		}
	}
	if v := got.Header.Values(core.HeaderReplayed); !slices.Equal(v, []string{"true"}) {
		t.Errorf("replay %s: %q, want [true]", core.HeaderReplayed, v)
	}
}

// problem is an RFC 9457 problem document.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// wantProblem fails unless res is a problem document with status and the
// type core.DefaultProblemBase+slug (any type when slug is ""), with a
// title and a detail, served as application/problem+json with
// Cache-Control: no-store.
func wantProblem(t *testing.T, res result, status int, slug string) problem {
	t.Helper()
	return wantProblemBase(t, res, status, core.DefaultProblemBase, slug)
}

// wantProblemBase is wantProblem for an engine with WithProblemBase(base).
func wantProblemBase(t *testing.T, res result, status int, base, slug string) problem {
	t.Helper()
	if res.Status != status {
		t.Fatalf("status %d, want %d (%s); response: %v", res.Status, status, slug, res)
	}
	if mt, _, err := mime.ParseMediaType(res.Header.Get("Content-Type")); err != nil || mt != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", res.Header.Get("Content-Type"))
	}
	if cc := res.Header.Get("Cache-Control"); !strings.Contains(cc, "no-store") {
		t.Errorf("Cache-Control %q, want no-store", cc)
	}
	if link, want := res.Header.Get("Link"), "<"+core.DefaultProblemDocs+`>; rel="describedby"`; link != want {
		t.Errorf("Link %q, want %q", link, want)
	}
	var p problem
	if err := json.Unmarshal([]byte(res.Body), &p); err != nil {
		t.Fatalf("the body is not a JSON problem document: %v; body %q", err, res.Body)
	}
	if slug != "" && p.Type != base+slug {
		t.Errorf("problem type %q, want %q", p.Type, base+slug)
	}
	if p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Errorf("problem document without type, title or detail: %q", res.Body)
	}
	if p.Status != status {
		t.Errorf("problem status %d, want %d", p.Status, status)
	}
	return p
}

// wantRetryAfter fails unless res has a Retry-After of a positive number of
// seconds.
func wantRetryAfter(t *testing.T, res result) {
	t.Helper()
	v := res.Header.Get("Retry-After")
	if n, err := strconv.Atoi(v); err != nil || n < 1 {
		t.Errorf("Retry-After %q, want a positive number of seconds", v)
	}
}

// count returns how many live records the store holds, in every state,
// at the suite's time (store.Inspector's List).
func (x *harness) count() int {
	x.t.Helper()
	n := 0
	for _, st := range []store.State{store.StateInProgress, store.StateCompleted, store.StateIndeterminate} {
		q := store.ListQuery{State: st, Now: x.clock.Now(), Limit: store.MaxListLimit}
		for {
			recs, err := x.records.List(context.Background(), q)
			if err != nil {
				x.t.Fatalf("counting the records: %v", err)
			}
			n += len(recs)
			if len(recs) < q.Limit {
				break
			}
			q.After = store.CursorOf(recs[len(recs)-1])
		}
	}
	return n
}
