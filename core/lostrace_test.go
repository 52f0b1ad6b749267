package core_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// losing is a memory store whose commits can lose a race, as a commit on a
// MariaDB Galera node that fails certification does: the transaction is
// rolled back, before returning, winner (if set) runs as the concurrent
// attempt on another node that won, and Commit fails with core.ErrLostRace.
type losing struct {
	*memstore.AtomicStore
	lose   atomic.Bool
	winner func()
	// completeErr, when set, is what the next Complete returns instead of
	// completing (once): a statement that met a transaction the database
	// aborted (MySQL/MariaDB 1213: ErrTxAborted and ErrLostRace; Postgres
	// 25P02: ErrTxAborted alone).
	completeErr atomic.Pointer[error]
}

func (l *losing) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	if err := l.completeErr.Swap(nil); err != nil {
		return *err
	}
	return l.AtomicStore.Complete(ctx, id, token, c)
}

func (l *losing) failComplete(err error) { l.completeErr.Store(&err) }

// deadlockVictim is what sqlstore returns for MySQL/MariaDB error 1213 in a
// transaction (a deadlock victim, a failed Galera certification).
var deadlockVictim = fmt.Errorf("%w: %w: sqlstore: complete: Error 1213 (40001): Deadlock found", core.ErrTxAborted, core.ErrLostRace)

// aborted is what sqlstore returns for Postgres 25P02.
var aborted = fmt.Errorf("%w: sqlstore: complete: ERROR: current transaction is aborted (SQLSTATE 25P02)", core.ErrTxAborted)

func (l *losing) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	ctx, tx, err := l.AtomicStore.Begin(ctx)
	return ctx, &losingTx{Tx: tx, l: l}, err
}

type losingTx struct {
	store.Tx
	l *losing
}

func (t *losingTx) Commit() error {
	if !t.l.lose.CompareAndSwap(true, false) {
		return t.Tx.Commit()
	}
	_ = t.Tx.Rollback()
	if t.l.winner != nil {
		t.l.winner()
	}
	return fmt.Errorf("%w: certification failed", core.ErrLostRace)
}

// TestLostRaceIsADuplicate: a request whose commit lost a race (ErrLostRace)
// is answered as a duplicate: the winner's response replayed when the
// winner completed, else 409 with Retry-After; never 503, and its own
// answer (rolled back) never reaches the client.
func TestLostRaceIsADuplicate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		winner     bool
		wantStatus int
	}{
		{"WinnerCompleted_ReplaysTheWinner", true, http.StatusCreated},
		{"NoWinnerVisible_409", false, http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &losing{AtomicStore: memstore.New().Atomic()}
			e, err := core.New(st, core.WithSingleCaller(), quiet)
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "run %d", n)
			}))
			if tc.winner {
				st.winner = func() {
					if w := post(h, "k"); w.Code != http.StatusCreated || w.Body.String() != "run 2" {
						t.Errorf("the winner: %d %q", w.Code, w.Body)
					}
				}
			}
			st.lose.Store(true)
			w := post(h, "k")
			if w.Code != tc.wantStatus {
				t.Fatalf("the loser: %d %q, want %d", w.Code, w.Body, tc.wantStatus)
			}
			switch tc.wantStatus {
			case http.StatusCreated:
				if w.Body.String() != "run 2" || w.Header().Get(core.HeaderReplayed) != "true" {
					t.Errorf("the loser: %q (replayed %q), want the winner's \"run 2\" replayed", w.Body, w.Header().Get(core.HeaderReplayed))
				}
			case http.StatusConflict:
				if w.Header().Get("Retry-After") == "" {
					t.Errorf("the loser: 409 without Retry-After")
				}
				// Nothing of the loser persists: a retry runs.
				if w := post(h, "k"); w.Code != http.StatusCreated || w.Body.String() != "run 2" {
					t.Errorf("retry after the lost race: %d %q, want a first execution", w.Code, w.Body)
				}
			}
		})
	}
}

// TestOnceLostRace: Once whose commit lost a race returns the winner's
// value (replayed), or ErrInProgress when no winner is visible.
func TestOnceLostRace(t *testing.T) {
	st := &losing{AtomicStore: memstore.New().Atomic()}
	e, err := core.New(st, core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	msg := core.Message{Consumer: "c", ID: "m"}
	st.lose.Store(true)
	if _, err := e.Once(t.Context(), msg, func(context.Context) ([]byte, error) { return []byte("lost"), nil }); !errors.Is(err, core.ErrInProgress) {
		t.Fatalf("no winner: %v, want ErrInProgress", err)
	}
	st.winner = func() {
		if _, err := e.Once(t.Context(), msg, func(context.Context) ([]byte, error) { return []byte("winner"), nil }); err != nil {
			t.Errorf("the winner: %v", err)
		}
	}
	st.lose.Store(true)
	res, err := e.Once(t.Context(), msg, func(context.Context) ([]byte, error) { return []byte("lost"), nil })
	if err != nil || !res.Replayed || string(res.Value) != "winner" {
		t.Fatalf("with a winner: %+v, %v, want the winner's value replayed", res, err)
	}
}

// TestLostRaceBeforeAbort: an error that matches both ErrTxAborted and
// ErrLostRace (MySQL/MariaDB 1213 in a transaction) is answered as a lost
// race (409 + Retry-After, in-progress; the key free, the retry runs), not
// as an aborted transaction (whose answer to a 2xx is 503); after
// MarkEffect it is recorded as indeterminate instead (an external effect
// may have happened: no retry runs it again); ErrTxAborted alone (Postgres)
// answers a 2xx with 503 transaction-aborted and Retry-After.
func TestLostRaceBeforeAbort(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		effect     bool
		status     int // the handler's answer (201 if 0)
		wantStatus int
		wantType   string
		wantRetry  int // status of the retry
	}{
		{"DeadlockVictim_409", deadlockVictim, false, 0, http.StatusConflict, "in-progress", http.StatusCreated},
		// A 4xx too: the lost race is checked before the aborted
		// transaction, whose answer would record the 4xx in a new one (on
		// Galera, against the winner's claim).
		{"DeadlockVictim4xx_409", deadlockVictim, false, http.StatusNotFound, http.StatusConflict, "in-progress", http.StatusNotFound},
		// After MarkEffect the attempt is recorded as indeterminate, not
		// answered as a lost race with the key free; the client is told
		// the outcome is unknown (its 201 is not true: the writes were
		// rolled back), as every retry is.
		{"DeadlockVictimAfterMarkEffect_Indeterminate", deadlockVictim, true, 0, http.StatusInternalServerError, "outcome-unknown", http.StatusInternalServerError},
		{"AbortedAfterMarkEffect_Indeterminate", aborted, true, 0, http.StatusInternalServerError, "outcome-unknown", http.StatusInternalServerError},
		{"AbortedAlone_503", aborted, false, 0, http.StatusServiceUnavailable, "transaction-aborted", http.StatusCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &losing{AtomicStore: memstore.New().Atomic()}
			e, err := core.New(st, core.WithSingleCaller(), quiet)
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				if tc.effect {
					if err := core.MarkEffect(r.Context()); err != nil {
						t.Error(err)
					}
				}
				w.WriteHeader(cmp.Or(tc.status, http.StatusCreated))
				fmt.Fprintf(w, "run %d", n)
			}))
			st.failComplete(tc.err)
			w := post(h, "k")
			if tc.wantStatus != 0 {
				if w.Code != tc.wantStatus || !strings.Contains(w.Body.String(), tc.wantType) {
					t.Fatalf("first: %d %q, want %d %s", w.Code, w.Body, tc.wantStatus, tc.wantType)
				}
				if retry := w.Header().Get("Retry-After") != ""; retry != !tc.effect {
					t.Errorf("first: %d with Retry-After %v, want %v (an unknown outcome is not worth retrying)", w.Code, retry, !tc.effect)
				}
			}
			w = post(h, "k")
			if w.Code != tc.wantRetry {
				t.Fatalf("retry: %d %q, want %d", w.Code, w.Body, tc.wantRetry)
			}
			if tc.effect && !strings.Contains(w.Body.String(), "outcome-unknown") {
				t.Errorf("retry after MarkEffect: %q, want the outcome-unknown problem replayed", w.Body)
			}
			wantRuns := int64(2)
			if tc.effect {
				wantRuns = 1 // indeterminate: not run again
			}
			if n := runs.Load(); n != wantRuns {
				t.Errorf("the handler ran %d times, want %d", n, wantRuns)
			}
		})
	}
}

// TestOnceLostRaceInTheCallersTransaction: in the caller's transaction a
// lost race (1213) makes Once return an error matching ErrInProgress (a
// consumer nacks), ErrLostRace and ErrTxAborted (the caller rolls back).
func TestOnceLostRaceInTheCallersTransaction(t *testing.T) {
	st := &losing{AtomicStore: memstore.New().Atomic()}
	e, err := core.New(st, core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, tx, err := st.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	st.failComplete(deadlockVictim)
	_, err = e.Once(ctx, core.Message{Consumer: "c", ID: "m"}, func(context.Context) ([]byte, error) { return []byte("v"), nil })
	for _, want := range []error{core.ErrInProgress, core.ErrLostRace, core.ErrTxAborted} {
		if !errors.Is(err, want) {
			t.Errorf("Once: %v, want it to match %v", err, want)
		}
	}
}

// TestLostRaceClientGone: the settling read after a lost race does not run
// on the client's context: a loser whose client went away (its context
// cancelled while the handler ran) still reads the winner's record, and
// reports the replay, not a store error (issue 21, item 6: 46 lost races
// of gone clients were logged as store errors).
func TestLostRaceClientGone(t *testing.T) {
	st := &losing{AtomicStore: memstore.New().Atomic()}
	var decisions []observe.Decision
	e, err := core.New(st, core.WithSingleCaller(), quiet, core.WithObserver(func(_ context.Context, ev observe.Event) {
		decisions = append(decisions, ev.Decision)
	}))
	if err != nil {
		t.Fatal(err)
	}
	var cancel context.CancelFunc
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cancel != nil {
			cancel() // the loser's client goes away
		}
		w.WriteHeader(http.StatusCreated)
	}))
	st.winner = func() {
		c := cancel
		cancel = nil
		if w := post(h, "k"); w.Code != http.StatusCreated {
			t.Errorf("the winner: %d %q", w.Code, w.Body)
		}
		cancel = c
	}
	st.lose.Store(true)
	ctx, c := context.WithCancel(context.Background())
	cancel = c
	req := httptest.NewRequestWithContext(ctx, "POST", "/pay", strings.NewReader(`{"amount":10}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(core.HeaderKey, "k")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if len(decisions) != 2 || decisions[1] != observe.DecisionReplayed {
		t.Fatalf("decisions %v, want [executed replayed]: the loser reads the winner's record though its client is gone", decisions)
	}
}
