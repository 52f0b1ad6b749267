package core_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// busy checks that w is a 409 in-progress with Retry-After want (seconds).
func busy(t *testing.T, at time.Duration, w *httptest.ResponseRecorder, want string) {
	t.Helper()
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "in-progress") || w.Header().Get("Retry-After") != want {
		t.Errorf("a duplicate at %s: %d Retry-After %q %s, want 409 in-progress with Retry-After %s", at, w.Code, w.Header().Get("Retry-After"), w.Body, want)
	}
}

// sleepUntil sleeps (in a synctest bubble) until at after start.
func sleepUntil(start time.Time, at time.Duration) { time.Sleep(time.Until(start.Add(at))) }

// A leased attempt whose process died (its lease is no longer extended:
// here its extensions fail) holds the key until its lease lapses. Another
// process answers the retries 409 with the default Retry-After while the
// lease could still be a live holder's (more than half of it left: a live
// holder's heartbeat moves it a whole lease ahead every third of it), then
// with the time until it lapses, rounded up (never earlier than the
// takeover is allowed); at the lapse a retry takes it over.
func TestRetryAfterSaysWhenADeadLeaseLapses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		dead, err := core.New(&flaky{Store: st}, core.WithSingleCaller(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		alive, err := core.New(st, core.WithSingleCaller(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		gone := make(chan struct{})
		defer close(gone)
		hd := dead.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dead.Store().(*flaky).paused.Store(true) // the process is gone: nobody extends its lease
			<-gone
		}), core.Scope("pay"))
		ha := alive.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(201)
			_, _ = w.Write([]byte("taken over"))
		}), core.Scope("pay"))
		start := time.Now()
		go post(hd, "k")
		synctest.Wait() // claimed at 0 s, lease until 30 s

		for _, c := range []struct {
			at   time.Duration
			want string
		}{
			{0, "1"},                        // a fresh lease: maybe a live holder
			{14 * time.Second, "1"},         // 16 s left: a live holder's heartbeat (every 10 s) could still extend it
			{16 * time.Second, "14"},        // 14 s left: two heartbeats missed, it lapses at 30 s
			{29500 * time.Millisecond, "1"}, // 0.5 s left, rounded up
		} {
			sleepUntil(start, c.at)
			busy(t, c.at, post(ha, "k"), c.want)
		}
		time.Sleep(500 * time.Millisecond) // 30 s: the lease lapsed
		if w := post(ha, "k"); w.Code != 201 || w.Body.String() != "taken over" {
			t.Fatalf("retry at 30 s: %d %q, want the takeover's 201", w.Code, w.Body)
		}
	})
}

// A live leased attempt (its heartbeat extends the lease) is never said to
// lapse: every duplicate gets the default Retry-After, however long it runs.
func TestRetryAfterOfALiveLeaseIsTheDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithRetryAfter(2*time.Second), quiet)
		if err != nil {
			t.Fatal(err)
		}
		h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(2*core.DefaultLease + 10*time.Second)
			w.WriteHeader(201)
		}), core.Scope("pay"))
		start := time.Now()
		done := make(chan int)
		go func() { done <- post(h, "k").Code }()
		synctest.Wait()
		for _, at := range []time.Duration{1, 9, 14, 16, 19, 29, 31, 45, 59, 69} {
			sleepUntil(start, at*time.Second)
			busy(t, at*time.Second, post(h, "k"), "2")
		}
		if code := <-done; code != 201 {
			t.Fatalf("the attempt answered %d", code)
		}
	})
}

// An attempt of this process past its MaxAttempt bound no longer extends
// its lease (it lapses, so that a retry can take over): once less than half
// of it is left, the duplicates are told when it lapses.
func TestRetryAfterOfAnAttemptPastMaxAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, err := core.New(memstore.New(), core.WithSingleCaller(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		stuck := make(chan struct{})
		defer close(stuck)
		h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-stuck // ignores its context's end at the bound
		}), core.Scope("pay"), core.MaxAttempt(5*time.Second))
		start := time.Now()
		go post(h, "k")
		synctest.Wait()
		// Claimed until 30 s; past the bound at 5 s, so the heartbeat at
		// 10 s does not extend it.
		sleepUntil(start, 12*time.Second)
		busy(t, 12*time.Second, post(h, "k"), "1")
		sleepUntil(start, 20*time.Second)
		busy(t, 20*time.Second, post(h, "k"), "10")
	})
}

// In atomic mode an in-progress record has no lease: the default
// Retry-After, however long the attempt runs.
func TestRetryAfterInAtomicModeIsTheDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, err := core.New(memstore.New().Atomic(), core.WithSingleCaller(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Minute)
			w.WriteHeader(201)
		}), core.Scope("pay"))
		start := time.Now()
		done := make(chan int)
		go func() { done <- post(h, "k").Code }()
		synctest.Wait()
		for _, at := range []time.Duration{1, 20, 45} {
			sleepUntil(start, at*time.Second)
			busy(t, at*time.Second, post(h, "k"), "1")
		}
		<-done
	})
}

// stubborn is a store that leaves a record as it was when the engine
// settles it. With lease, a claim's Takeover is not honoured (as when the
// database cannot lock the row) and Complete fails, so a lapsed record
// can be neither taken over nor marked indeterminate; with release, its
// Release is fenced and changes nothing (a store that misreports a
// concurrent settler). It counts the claims, and fails them past 50 so
// that a test of a spinning engine ends.
type stubborn struct {
	store.Store
	lease, release bool
	// until: lease refuses only the claims up to this one (a blip), when
	// not 0.
	until int64
	// failMarks: the first failMarks completions fail (a blip while the
	// retry marks the record indeterminate).
	failMarks int64
	claims    atomic.Int64
	completes atomic.Int64
}

func (s *stubborn) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	n := s.claims.Add(1)
	if n > 50 {
		return store.ClaimResult{}, errors.New("stubborn: the engine keeps claiming")
	}
	req.Takeover = req.Takeover && !(s.lease && (s.until == 0 || n <= s.until))
	return s.Store.Claim(ctx, req)
}

func (s *stubborn) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	if s.lease || s.completes.Add(1) <= s.failMarks {
		return fmt.Errorf("%w: stubborn", core.ErrStoreUnavailable)
	}
	return s.Store.Complete(ctx, id, token, c)
}

func (s *stubborn) Release(ctx context.Context, id store.ID, token int64) error {
	if s.release {
		return core.ErrFenced
	}
	return s.Store.Release(ctx, id, token)
}

// lapsedHolder leaves an attempt of key "k" (scope pay) in st that died
// holding its lease, and returns once the lease has lapsed (in a synctest
// bubble).
func lapsedHolder(t *testing.T, st store.Store, opts ...core.Option) {
	dead, err := core.New(&flaky{Store: st}, append([]core.Option{core.WithSingleCaller(), quiet}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	gone := make(chan struct{})
	t.Cleanup(func() { close(gone) })
	hd := dead.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dead.Store().(*flaky).paused.Store(true) // the process is gone: nobody extends its lease
		<-gone
	}), core.Scope("pay"))
	go post(hd, "k")
	synctest.Wait()
	time.Sleep(time.Minute) // the lease lapsed
}

// A retry that meets a lapsed lease it cannot settle (the takeover is not
// honoured, or marking the record indeterminate fails) answers 409 after
// a few claims instead of claiming again without end, a hot loop against
// the database for as long as the record stays so.
func TestLapsedRecordThatCannotBeSettled(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []core.Option
	}{{"takeover", nil}, {"without-takeover", []core.Option{core.WithoutTakeover()}}} {
		t.Run(mode.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memstore.New()
				lapsedHolder(t, st)
				u := &stubborn{Store: st, lease: true}
				alive, err := core.New(u, append([]core.Option{core.WithSingleCaller(), quiet}, mode.opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				ha := alive.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					t.Error("the handler ran while the lapsed attempt's record stands")
				}), core.Scope("pay"))
				w := post(ha, "k")
				if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "in-progress") || w.Header().Get("Retry-After") != "1" {
					t.Errorf("retry: %d Retry-After %q %s, want 409 in-progress with Retry-After 1", w.Code, w.Header().Get("Retry-After"), w.Body)
				}
				if n := u.claims.Load(); n > 10 {
					t.Errorf("the retry claimed %d times, want a few", n)
				}
			})
		})
	}
}

// With WaitInFlight, a retry that cannot settle a lapsed record (its
// takeovers not honoured: a store blip) waits as an in-flight duplicate
// does and settles it afresh, within the wait: a blip that passes ends in
// the takeover and the handler's answer, not in a 409 while wait is left;
// a store that never honours it gets 409 once the wait is over, after a
// bounded number of claims.
func TestLapsedRecordSettledWithinTheWait(t *testing.T) {
	for _, tc := range []struct {
		name  string
		until int64 // the claims whose takeover the store refuses; 0: all
		want  int
	}{{"blip", 6, http.StatusCreated}, {"never", 0, http.StatusConflict}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memstore.New()
				lapsedHolder(t, st)
				u := &stubborn{Store: st, lease: true, until: tc.until}
				alive, err := core.New(u, core.WithSingleCaller(), quiet)
				if err != nil {
					t.Fatal(err)
				}
				ran := 0
				ha := alive.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ran++
					w.WriteHeader(http.StatusCreated)
				}), core.Scope("pay"), core.WaitInFlight(time.Second))
				start := time.Now()
				w := post(ha, "k")
				if w.Code != tc.want {
					t.Errorf("retry: %d %s, want %d", w.Code, w.Body, tc.want)
				}
				if want := btoi(tc.want == http.StatusCreated); ran != want {
					t.Errorf("the handler ran %d times, want %d", ran, want)
				}
				if tc.want == http.StatusConflict && time.Since(start) < time.Second {
					t.Errorf("409 after %v, before the wait (1s) was over", time.Since(start))
				}
				if n := u.claims.Load(); n > 40 {
					t.Errorf("the retry claimed %d times, want a bounded few", n)
				}
			})
		})
	}
}

// A retry whose marks of a lapsed record fail a few times (a store blip)
// and then succeed goes on to the resolver: the settles of the record in
// progress are not counted against the indeterminate record it became,
// with WaitInFlight (the mark succeeds after a pause) and without (it
// succeeds at the last settle).
func TestLapsedRecordMarkedAfterABlip(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failMarks int64
		wait      time.Duration
	}{{"within-the-wait", 3, time.Second}, {"last-settle", 2, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memstore.New()
				lapsedHolder(t, st, core.WithoutTakeover())
				u := &stubborn{Store: st, failMarks: tc.failMarks}
				alive, err := core.New(u, core.WithSingleCaller(), core.WithoutTakeover(), quiet)
				if err != nil {
					t.Fatal(err)
				}
				var asked atomic.Int64
				ran := 0
				opts := []core.RouteOption{core.Scope("pay"), core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) {
					asked.Add(1)
					return core.Resolution{Outcome: core.OutcomeNotApplied}, nil
				})}
				if tc.wait > 0 {
					opts = append(opts, core.WaitInFlight(tc.wait))
				}
				ha := alive.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ran++
					w.WriteHeader(http.StatusCreated)
				}), opts...)
				w := post(ha, "k")
				if w.Code != http.StatusCreated || ran != 1 || asked.Load() != 1 {
					t.Errorf("retry: %d %s, the handler ran %d times, the resolver was asked %d times; want 201, once, once",
						w.Code, w.Body, ran, asked.Load())
				}
			})
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A retry whose resolver says "not applied" about an indeterminate record
// that the release then leaves as it was answers from the record (500
// outcome-unknown) after a few claims, instead of asking the resolver and
// claiming again without end.
func TestIndeterminateRecordThatCannotBeReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		lapsedHolder(t, st, core.WithoutTakeover())
		f := &stubborn{Store: st, release: true}
		alive, err := core.New(f, core.WithSingleCaller(), core.WithoutTakeover(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		var asked atomic.Int64
		ha := alive.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t.Error("the handler ran while the indeterminate record stands")
		}), core.Scope("pay"), core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) {
			asked.Add(1)
			return core.Resolution{Outcome: core.OutcomeNotApplied}, nil
		}))
		w := post(ha, "k") // marks the lapsed record indeterminate, then asks the resolver
		if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "outcome-unknown") {
			t.Errorf("retry: %d %s, want 500 outcome-unknown", w.Code, w.Body)
		}
		if n := f.claims.Load(); n > 10 {
			t.Errorf("the retry claimed %d times (the resolver asked %d times), want a few", n, asked.Load())
		}
	})
}
