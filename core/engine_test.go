package core_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/seal"
	"github.com/idemkit/idem/core/store"
)

var quiet = core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

func TestNewRequiresACallerDecision(t *testing.T) {
	st := memstore.New()
	if _, err := core.New(st); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("nok, New without a caller decision: %v, want ErrConfig", err)
	}
	caller := core.WithCaller(func(*http.Request) (string, error) { return "a", nil })
	if _, err := core.New(st, caller, core.WithSingleCaller()); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("nok, both caller options: %v, want ErrConfig", err)
	}
	if _, err := core.New(nil, caller); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("nok, nil store: %v", err)
	}
	if _, err := core.New(st, core.WithSingleCaller()); err != nil {
		t.Fatalf("ok, an explicit single caller: %v", err)
	}
}

// flaky wraps a store; while paused, Extend fails like a network partition.
type flaky struct {
	store.Store
	paused atomic.Bool
}

func (f *flaky) Extend(ctx context.Context, id store.ID, token int64, until time.Time) error {
	if f.paused.Load() {
		return core.ErrStoreUnavailable
	}
	return f.Store.Extend(ctx, id, token, until)
}

func post(h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amount":10}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(core.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func TestLeaseHeartbeatKeepsASlowAttemptAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithLease(3*time.Second), quiet)
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			time.Sleep(20 * time.Second) // virtual time: far beyond the lease
			w.WriteHeader(201)
		}), core.Scope("pay"))
		done := make(chan int)
		go func() { done <- post(h, "k").Code }()
		time.Sleep(10 * time.Second)
		if w := post(h, "k"); w.Code != 409 || w.Header().Get("Retry-After") == "" {
			t.Fatalf("nok, a duplicate during a heartbeat-extended lease got %d, want 409 with Retry-After", w.Code)
		}
		if code := <-done; code != 201 {
			t.Fatalf("first attempt answered %d", code)
		}
		if w := post(h, "k"); w.Code != 201 || w.Header().Get(core.HeaderReplayed) != "true" || runs.Load() != 1 {
			t.Fatalf("nok, replay after completion: %d, runs %d", w.Code, runs.Load())
		}
	})
}

func TestPausedAttemptLosesItsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &flaky{Store: memstore.New()}
		e, err := core.New(st, core.WithSingleCaller(), core.WithLease(3*time.Second), quiet)
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		var firstCtxErr atomic.Value
		h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			if n == 1 {
				st.paused.Store(true) // the first attempt can no longer extend its lease
				<-r.Context().Done()  // ... until a heartbeat learns it was taken over
				firstCtxErr.Store(context.Cause(r.Context()))
			}
			w.WriteHeader(201)
			io.WriteString(w, "attempt "+string(rune('0'+n)))
		}), core.Scope("pay"))
		first := make(chan *httptest.ResponseRecorder)
		go func() { first <- post(h, "k") }()
		time.Sleep(4 * time.Second) // past the 3 s lease
		second := post(h, "k")
		if second.Code != 201 || second.Body.String() != "attempt 2" {
			t.Fatalf("nok, takeover after the lease lapsed: %d %q", second.Code, second.Body)
		}
		st.paused.Store(false)
		w := <-first
		if w.Code != 409 || !strings.Contains(w.Body.String(), "lease-lost") {
			t.Fatalf("nok, the stale attempt's completion must be refused: %d %s", w.Code, w.Body)
		}
		if err, _ := firstCtxErr.Load().(error); !errors.Is(err, core.ErrLeaseLost) {
			t.Fatalf("nok, the stale attempt's context cause = %v, want ErrLeaseLost", err)
		}
		if w := post(h, "k"); w.Body.String() != "attempt 2" || w.Header().Get(core.HeaderReplayed) != "true" {
			t.Fatalf("nok, replays must serve the new owner's response, got %q", w.Body)
		}
	})
}

func TestOnce(t *testing.T) {
	for _, mode := range []string{"leased", "atomic"} {
		t.Run(mode, func(t *testing.T) {
			var st store.Store = memstore.New()
			if mode == "atomic" {
				st = memstore.New().Atomic()
			}
			e, err := core.New(st, core.WithSingleCaller(), quiet)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			msg := core.Message{Consumer: "billing", ID: "m1"}
			var runs atomic.Int32
			fn := func(ctx context.Context) ([]byte, error) {
				runs.Add(1)
				return []byte("row 42"), nil
			}
			if r, err := e.Once(ctx, msg, fn); err != nil || r.Replayed || string(r.Value) != "row 42" {
				t.Fatalf("ok, first delivery runs: %+v %v", r, err)
			}
			if r, err := e.Once(ctx, msg, fn); err != nil || !r.Replayed || string(r.Value) != "row 42" || runs.Load() != 1 {
				t.Fatalf("ok, a redelivery returns the first run's value: %+v %v", r, err)
			}
			if r, _ := e.Once(ctx, core.Message{Consumer: "shipping", ID: "m1"}, fn); r.Replayed {
				t.Fatal("nok, another consumer of the same message must run")
			}

			failing := core.Message{Consumer: "billing", ID: "m2"}
			boom := errors.New("boom")
			if _, err := e.Once(ctx, failing, func(context.Context) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
				t.Fatalf("the function's error is returned: %v", err)
			}
			if r, err := e.Once(ctx, failing, fn); err != nil || r.Replayed {
				t.Fatalf("ok, a failure without a marked effect releases: %+v %v", r, err)
			}

			effect := core.Message{Consumer: "billing", ID: "m3"}
			_, _ = e.Once(ctx, effect, func(ctx context.Context) ([]byte, error) {
				core.MarkEffect(ctx)
				return nil, boom
			})
			if _, err := e.Once(ctx, effect, fn); !errors.Is(err, core.ErrIndeterminate) {
				t.Fatalf("nok, a failure after a marked effect is indeterminate: %v", err)
			}

			busy := core.Message{Consumer: "billing", ID: "m4"}
			hold, release := make(chan struct{}), make(chan struct{})
			go e.Once(ctx, busy, func(context.Context) ([]byte, error) { close(hold); <-release; return nil, nil })
			<-hold
			_, err = e.Once(ctx, busy, fn)
			var re *core.RetryError
			if !errors.Is(err, core.ErrInProgress) || !errors.As(err, &re) || re.RetryAfter <= 0 {
				t.Fatalf("nok, an in-flight duplicate is declined at once: %v", err)
			}
			close(release)

			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("nok, the panic must propagate")
					}
				}()
				e.Once(ctx, core.Message{Consumer: "billing", ID: "m5"}, func(context.Context) ([]byte, error) { panic("x") })
			}()
			if r, err := e.Once(ctx, core.Message{Consumer: "billing", ID: "m5"}, fn); err != nil || r.Replayed {
				t.Fatalf("ok, a panic releases: %+v %v", r, err)
			}
		})
	}
}

func TestOnceJoinsTheCallersTransaction(t *testing.T) {
	st := memstore.New().Atomic()
	e, _ := core.New(st, core.WithSingleCaller(), quiet)
	msg := core.Message{Consumer: "c", ID: "m"}
	fn := func(context.Context) ([]byte, error) { return []byte("v"), nil }

	txctx, tx, err := st.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Once(txctx, msg, fn); err != nil {
		t.Fatal(err)
	}
	tx.Rollback() // the caller rolls back: the record goes with its writes
	if r, err := e.Once(context.Background(), msg, fn); err != nil || r.Replayed {
		t.Fatalf("ok, after the caller's rollback the message runs again: %+v %v", r, err)
	}
}

func TestSweeper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		e, _ := core.New(st, core.WithSingleCaller(), quiet)
		ctx := context.Background()
		for _, id := range []string{"a", "b", "c"} {
			e.Once(ctx, core.Message{Consumer: "c", ID: id}, func(context.Context) ([]byte, error) { return nil, nil }, core.Retention(time.Hour))
		}
		s := e.Sweeper()
		s.Every, s.Batch = 10*time.Minute, 2
		s.Start(ctx)
		time.Sleep(59 * time.Minute)
		synctest.Wait()
		if st.Len() != 3 {
			t.Fatalf("live records must stay, have %d", st.Len())
		}
		time.Sleep(11 * time.Minute)
		synctest.Wait()
		if st.Len() != 0 {
			t.Fatalf("expired records must be swept, %d left", st.Len())
		}
		s.Stop()
	})
}

// failingGet wraps a store whose Get fails while failing is set.
type failingGet struct {
	store.Store
	failing atomic.Bool
}

func (f *failingGet) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	if f.failing.Load() {
		return store.Record{}, core.ErrStoreUnavailable
	}
	return f.Store.Get(ctx, id, now)
}

// A resolver settles an indeterminate record as applied, and the engine's
// read-back of the settled record fails: the request answers 503 (the
// client retries and gets the settled answer), it does not crash.
func TestResolverReadBackFailure(t *testing.T) {
	st := &failingGet{Store: memstore.New()}
	var calls atomic.Int32
	e, err := core.New(st, quiet, core.WithSingleCaller(),
		core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) {
			return core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{Status: 201, Body: []byte(`{"ok":true}`), BodyKept: true}}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		core.MarkEffect(r.Context())
		w.WriteHeader(http.StatusBadGateway) // after MarkEffect: indeterminate
	}))
	if w := post(h, "k"); w.Code != http.StatusBadGateway {
		t.Fatalf("first: %d, want the handler's 502", w.Code)
	}
	st.failing.Store(true)
	if w := post(h, "k"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("retry while the read-back fails: %d %s, want 503", w.Code, w.Body)
	}
	st.failing.Store(false)
	if w := post(h, "k"); w.Code != 201 || w.Header().Get(core.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %s, want the settled 201 replayed", w.Code, w.Body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// Fail-open runs the handler only when the store cannot be reached: a
// record that was found but whose response cannot be opened (here: sealed,
// and the engine has no sealer) answers 503 and does not run the handler
// again. A duplicated allowlist records and replays each header once.
func TestFailOpenNeverReRunsAnUnreadableRecord(t *testing.T) {
	st := memstore.New()
	var calls atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("ETag", `"v1"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
	})
	key := make([]byte, 32)
	sealer, err := seal.NewAESGCM(map[string][]byte{"k1": key}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := core.New(st, quiet, core.WithSingleCaller(), core.WithSealer(sealer),
		core.WithRecordedHeaders("ETag", "Content-Type", "Etag"))
	if err != nil {
		t.Fatal(err)
	}
	if w := post(sealed.Handler(handler), "k"); w.Code != 201 {
		t.Fatalf("first: %d", w.Code)
	}
	if w := post(sealed.Handler(handler), "k"); w.Code != 201 || w.Header().Get(core.HeaderReplayed) != "true" || len(w.Header()["Etag"]) != 1 {
		t.Fatalf("replay: %d %v", w.Code, w.Header())
	}
	plain, err := core.New(st, quiet, core.WithSingleCaller(), core.WithFailOpen())
	if err != nil {
		t.Fatal(err)
	}
	if w := post(plain.Handler(handler), "k"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("replay without the sealer, fail-open: %d %s, want 503", w.Code, w.Body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}
