package core_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// adminT0 is the time the operator tests start at.
var adminT0 = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// payments is a protected payment route on its own engine (a replica)
// over a shared store: the handler marks the charge, then answers what
// answer returns (502: the provider timed out; the record is left
// indeterminate), after block (if not nil) is closed.
type payments struct {
	e      *core.Engine
	mux    http.Handler
	ran    atomic.Int32
	answer atomic.Int32
	block  chan struct{}
	inside chan struct{} // receives when the handler has marked the charge
}

func newPayments(t *testing.T, store store.Store, opts ...core.Option) *payments {
	t.Helper()
	e, err := core.New(store, append([]core.Option{core.WithSingleCaller(), quiet}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	p := &payments{e: e, inside: make(chan struct{}, 8)}
	p.answer.Store(http.StatusBadGateway)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.ran.Add(1)
		if err := core.MarkEffect(r.Context()); err != nil {
			t.Error(err)
		}
		p.inside <- struct{}{}
		if p.block != nil {
			<-p.block
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(p.answer.Load()))
		_, _ = w.Write([]byte(`{"charge":"ch_1"}`))
	})))
	p.mux = mux
	return p
}

// pay sends the payment request with key.
func (p *payments) pay(key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(core.HeaderKey, key)
	w := httptest.NewRecorder()
	p.mux.ServeHTTP(w, r)
	return w
}

// logBuffer is a logger that keeps what it logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) option() core.Option {
	return core.WithLogger(slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo})))
}

// onlyRecord lists the records in state st and returns the only one.
func onlyRecord(t *testing.T, e *core.Engine, st store.State) admin.Record {
	t.Helper()
	page, err := e.Records(context.Background(), admin.Query{State: st})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Records) != 1 {
		t.Fatalf("Records(%v): %d records, want 1: %+v", st, len(page.Records), page.Records)
	}
	return page.Records[0]
}

func mustID(t *testing.T, s string) store.ID {
	t.Helper()
	id, err := store.ParseID(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// An indeterminate payment is listed with why it is stuck, shown with
// its recorded answer, and resolved by an operator as applied: every
// retry then gets the operator's answer, and the handler never runs
// again. The action is logged with the record id and the reason.
func TestOperatorResolvesIndeterminateAsApplied(t *testing.T) {
	var logs logBuffer
	p := newPayments(t, memstore.New(), logs.option())
	if w := p.pay("k1"); w.Code != http.StatusBadGateway {
		t.Fatalf("first attempt: %d, want 502", w.Code)
	}
	listed := onlyRecord(t, p.e, store.StateIndeterminate)
	if listed.Status != http.StatusBadGateway || listed.Response != nil || !strings.Contains(listed.Why, "outcome unknown") || listed.Key != "k1" {
		t.Fatalf("listed: %+v; want status 502, no response, a why, key k1", listed)
	}
	id := mustID(t, listed.ID)
	shown, err := p.e.Record(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if shown.Response == nil || shown.Response.Status != 502 || shown.Response.Body != `{"charge":"ch_1"}` || !shown.Response.BodyKept {
		t.Fatalf("shown: %+v, response %+v; want the recorded 502 and its body", shown, shown.Response)
	}

	got, err := p.e.ResolveRecord(context.Background(), id, core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{
		Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"payment":"pay_1"}`),
	}}, "provider dashboard shows ch_1 captured (ticket OPS-12)")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "completed" || got.Status != 201 || got.Response == nil || got.Response.Body != `{"payment":"pay_1"}` {
		t.Fatalf("ResolveRecord returned %+v", got)
	}
	w := p.pay("k1")
	if w.Code != http.StatusCreated || w.Body.String() != `{"payment":"pay_1"}` || w.Header().Get(core.HeaderReplayed) != "true" ||
		w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("retry after the resolution: %d %q %v, want the operator's 201, replayed", w.Code, w.Body, w.Header())
	}
	if n := p.ran.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	log := logs.String()
	for _, want := range []string{`msg="idempotency: operator action"`, "id=" + listed.ID, "action=resolve_applied", `reason="provider dashboard shows ch_1 captured (ticket OPS-12)"`, "result=done", "state=indeterminate"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %s:\n%s", want, log)
		}
	}
	// A completed record is final.
	if _, err := p.e.ResolveRecord(context.Background(), id, core.Resolution{Outcome: core.OutcomeNotApplied}, "again"); !errors.Is(err, core.ErrFenced) {
		t.Fatalf("resolving a completed record: %v, want ErrFenced", err)
	}
	if err := p.e.ReleaseRecord(context.Background(), id, "again"); !errors.Is(err, core.ErrFenced) {
		t.Fatalf("releasing a completed record: %v, want ErrFenced", err)
	}
	if !strings.Contains(logs.String(), "result=refused") {
		t.Errorf("a refused action is not logged:\n%s", logs.String())
	}
}

// Resolved as not applied (or released), an indeterminate record is
// gone: the next retry runs the handler.
func TestOperatorResolvesIndeterminateAsNotApplied(t *testing.T) {
	for _, release := range []bool{false, true} {
		p := newPayments(t, memstore.New())
		p.pay("k1")
		id := mustID(t, onlyRecord(t, p.e, store.StateIndeterminate).ID)
		var err error
		if release {
			err = p.e.ReleaseRecord(context.Background(), id, "provider has no charge for the downstream key")
		} else {
			_, err = p.e.ResolveRecord(context.Background(), id, core.Resolution{Outcome: core.OutcomeNotApplied}, "provider has no charge")
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.e.Record(context.Background(), id); !errors.Is(err, core.ErrNotFound) {
			t.Fatalf("release %v: Record after the action: %v, want ErrNotFound", release, err)
		}
		p.answer.Store(http.StatusCreated)
		if w := p.pay("k1"); w.Code != http.StatusCreated || w.Header().Get(core.HeaderReplayed) != "" {
			t.Fatalf("release %v: retry: %d, want the handler's 201", release, w.Code)
		}
		if n := p.ran.Load(); n != 2 {
			t.Fatalf("release %v: the handler ran %d times, want 2", release, n)
		}
	}
}

// A replica that stopped extending its lease (its clock, and so its
// heartbeat, are stuck in the past: a crashed or partitioned process)
// leaves a payment in progress. An operator on another replica lists it
// as stuck and settles it; the settlement takes the lease over first, so
// the old attempt, which is still alive, cannot record anything when it
// ends (its completion is fenced: 409 lease lost), and the operator's
// outcome stays.
func TestOperatorSettlesALapsedLeaseFencingTheOldAttempt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release bool
	}{{"resolve applied", false}, {"release", true}} {
		t.Run(tc.name, func(t *testing.T) {
			st0 := memstore.New()
			stuck := newPayments(t, st0, core.WithClock(func() time.Time { return adminT0 }))
			stuck.block = make(chan struct{})
			stuck.answer.Store(http.StatusCreated)
			clock := &fakeClock{now: adminT0}
			op := newPayments(t, st0, core.WithClock(clock.Now))

			zombie := make(chan *httptest.ResponseRecorder, 1)
			go func() { zombie <- stuck.pay("k1") }()
			<-stuck.inside

			// While the lease runs, the operator may not act.
			running := onlyRecord(t, op.e, store.StateInProgress)
			if running.LeaseLapsed || !strings.Contains(running.Why, "is running") {
				t.Fatalf("listed while the lease runs: %+v", running)
			}
			id := mustID(t, running.ID)
			if err := op.e.ReleaseRecord(context.Background(), id, "looks stuck"); !errors.Is(err, core.ErrInProgress) {
				t.Fatalf("release under a live lease: %v, want ErrInProgress", err)
			}
			clock.Add(time.Minute)
			lapsed := onlyRecord(t, op.e, store.StateInProgress)
			if !lapsed.LeaseLapsed || !strings.Contains(lapsed.Why, "stuck") {
				t.Fatalf("listed after the lease lapsed: %+v", lapsed)
			}
			if tc.release {
				if err := op.e.ReleaseRecord(context.Background(), id, "provider has no charge"); err != nil {
					t.Fatal(err)
				}
			} else {
				got, err := op.e.ResolveRecord(context.Background(), id, core.Resolution{Outcome: core.OutcomeApplied,
					Response: &core.Response{Status: http.StatusCreated, Body: []byte(`{"payment":"by operator"}`)}}, "captured at the provider")
				if err != nil {
					t.Fatal(err)
				}
				if got.Attempt != 2 {
					t.Fatalf("resolved record: attempt %d, want 2 (the operator's takeover)", got.Attempt)
				}
			}
			close(stuck.block)
			if w := <-zombie; w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "lease-lost") {
				t.Fatalf("the old attempt's answer: %d %s, want 409 lease-lost", w.Code, w.Body)
			}
			w := op.pay("k1")
			switch {
			case tc.release && (w.Code != http.StatusBadGateway || op.ran.Load() != 1):
				t.Fatalf("retry after the release: %d (operator replica's handler ran %d times), want the handler run again", w.Code, op.ran.Load())
			case !tc.release && (w.Code != http.StatusCreated || w.Body.String() != `{"payment":"by operator"}` || op.ran.Load() != 0):
				t.Fatalf("retry after the resolution: %d %s, want the operator's answer replayed", w.Code, w.Body)
			}
		})
	}
}

// racing is a store on which another settler gets to an indeterminate
// record first: right before the operator's Complete or Release, it
// completes the record with the token it read too.
type racing struct {
	store.Inspector
	once sync.Once
}

func (s *racing) first(ctx context.Context, id store.ID, token int64) {
	s.once.Do(func() {
		_ = s.Inspector.Complete(ctx, id, token, store.Completion{State: store.StateCompleted, Status: 200,
			Response: nil, ExpiresAt: adminT0.Add(time.Hour)})
	})
}

func (s *racing) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	if c.State == store.StateCompleted {
		s.first(ctx, id, token)
	}
	return s.Inspector.Complete(ctx, id, token, c)
}

func (s *racing) Release(ctx context.Context, id store.ID, token int64) error {
	s.first(ctx, id, token)
	return s.Inspector.Release(ctx, id, token)
}

// An operator who loses the race to another settler (a resolver answering
// a retry, a completer) changes nothing and is told what the record is
// now; the other settler's outcome stays.
func TestOperatorLosesARaceToAnotherSettler(t *testing.T) {
	for _, release := range []bool{false, true} {
		st0 := &racing{Inspector: memstore.New()}
		clock := &fakeClock{now: adminT0}
		p := newPayments(t, st0, core.WithClock(clock.Now))
		p.pay("k1")
		id := mustID(t, onlyRecord(t, p.e, store.StateIndeterminate).ID)
		var err error
		if release {
			err = p.e.ReleaseRecord(context.Background(), id, "no charge")
		} else {
			_, err = p.e.ResolveRecord(context.Background(), id, core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{Status: 201}}, "charged")
		}
		if !errors.Is(err, core.ErrFenced) || !strings.Contains(err.Error(), "changed since it was read") || !strings.Contains(err.Error(), "completed it (status 200)") {
			t.Fatalf("release %v: %v, want ErrFenced saying the record was completed by another", release, err)
		}
		if rec, err := p.e.Record(context.Background(), id); err != nil || rec.Status != 200 {
			t.Fatalf("release %v: the record after the lost race: %+v, %v; want the other settler's 200", release, rec, err)
		}
	}
}

// What an operator's action refuses, and with which error.
func TestOperatorRefusals(t *testing.T) {
	p := newPayments(t, memstore.New())
	p.pay("k1")
	id := mustID(t, onlyRecord(t, p.e, store.StateIndeterminate).ID)
	ctx := context.Background()
	missing := store.Identity{Key: "never"}.ID()
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"no reason", p.e.ReleaseRecord(ctx, id, "  "), core.ErrConfig},
		{"unresolved", second(p.e.ResolveRecord(ctx, id, core.Resolution{Outcome: core.OutcomeUnresolved}, "r")), core.ErrConfig},
		{"applied without a response", second(p.e.ResolveRecord(ctx, id, core.Resolution{Outcome: core.OutcomeApplied}, "r")), core.ErrConfig},
		{"applied with status 0", second(p.e.ResolveRecord(ctx, id, core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{}}, "r")), core.ErrConfig},
		{"missing record", p.e.ReleaseRecord(ctx, missing, "r"), core.ErrNotFound},
		{"missing record, shown", second(p.e.Record(ctx, missing)), core.ErrNotFound},
		{"bad cursor", second(p.e.Records(ctx, admin.Query{After: "nope"})), core.ErrConfig},
		{"limit over the maximum", second(p.e.Records(ctx, admin.Query{Limit: store.MaxListLimit + 1})), core.ErrConfig},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	// Nothing was changed by the refusals.
	if rec, err := p.e.Record(ctx, id); err != nil || rec.State != "indeterminate" {
		t.Fatalf("after the refusals: %+v, %v", rec, err)
	}
	// A store that cannot list.
	plain, err := core.New(struct{ store.Store }{memstore.New()}, core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Records(ctx, admin.Query{}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("Records on a store without List: %v, want ErrConfig", err)
	}
}

func second[T any](_ T, err error) error { return err }

// Records pages through the stuck records oldest first, leaves out the
// younger ones with OlderThan, and ends with an empty Next.
func TestOperatorPagesThroughRecords(t *testing.T) {
	clock := &fakeClock{now: adminT0}
	p := newPayments(t, memstore.New(), core.WithClock(clock.Now))
	for _, key := range []string{"a", "b", "c", "d", "e"} {
		p.pay(key)
		clock.Add(time.Minute)
	}
	ctx := context.Background()
	var keys []string
	q := admin.Query{Limit: 2}
	for pages := 0; ; pages++ {
		page, err := p.e.Records(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			keys = append(keys, r.Key)
		}
		if page.Next == "" {
			break
		}
		if pages > 5 {
			t.Fatal("no end of the pages")
		}
		q.After = page.Next
	}
	if strings.Join(keys, "") != "abcde" {
		t.Fatalf("paged keys %v, want a b c d e", keys)
	}
	page, err := p.e.Records(ctx, admin.Query{OlderThan: 150 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Now is adminT0+5m: a, b, c were created at +0, +1m, +2m.
	if len(page.Records) != 3 || page.Records[2].Key != "c" || page.Next != "" {
		t.Fatalf("older than 150s: %+v, want a, b, c", page)
	}
}
