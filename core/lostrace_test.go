package core_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// losing is a memory store whose commits can lose a race, as a commit on a
// MariaDB Galera node that fails certification does: the transaction is
// rolled back, before returning, winner (if set) runs as the concurrent
// attempt on another node that won, and Commit fails with core.ErrLostRace.
type losing struct {
	*memstore.AtomicStore
	lose   atomic.Bool
	winner func()
}

func (l *losing) Begin(ctx context.Context) (context.Context, core.Tx, error) {
	ctx, tx, err := l.AtomicStore.Begin(ctx)
	return ctx, &losingTx{Tx: tx, l: l}, err
}

type losingTx struct {
	core.Tx
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
