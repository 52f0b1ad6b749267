package storetest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/storetest"
)

// The suite is checked against memstore in core/memstore. Here it is
// checked the other way round: each mutant below breaks one rule of the
// contract, and the cases named with it must fail. A suite that passes a
// broken store protects nothing.

// mutant is a store that breaks a rule on purpose.
type mutant struct {
	name  string
	fails []string // cases that must fail
	build func() store.Store
	opts  []storetest.Option // what the store declares about itself
}

var mutants = []mutant{
	{"CompleteIgnoresToken", []string{"Fencing", "Takeover", "ClaimExpired"}, func() store.Store {
		return &ignoreToken{Store: memstore.New()}
	}, nil},
	{"ClaimCheckThenAct", []string{"ClaimRace"}, func() store.Store {
		return &checkThenAct{Store: memstore.New()}
	}, nil},
	{"GetIgnoresExpiry", []string{"ExpiredIsAbsent"}, func() store.Store {
		return &ignoreExpiry{Store: memstore.New()}
	}, nil},
	{"DeleteExpiredIgnoresLimit", []string{"DeleteExpiredBatches", "DeleteExpiredConcurrent"}, func() store.Store {
		return &ignoreLimit{Store: memstore.New()}
	}, nil},
	{"SecondPrecision", []string{"ResponseBytes", "DeleteExpiredBatches"}, func() store.Store {
		return &seconds{Store: memstore.New()}
	}, nil},
	{"ResponseAliased", []string{"NoAliasing"}, func() store.Store {
		return &aliasing{Store: memstore.New(), kept: make(map[store.ID][]byte)}
	}, nil},
	{"IgnoresCancellation", []string{"CancelledContext"}, func() store.Store {
		return &ignoreCancel{Store: memstore.New()}
	}, nil},
	{"RollbackCommits", []string{"AtomicRollback", "AtomicUncommittedInvisible"}, func() store.Store {
		return &rollbackCommits{AtomicStore: memstore.New().Atomic()}
	}, nil},
	// SerialWriters relaxes when an answer may come, not what it is.
	{"RollbackCommitsSerial", []string{"AtomicRollback", "AtomicUncommittedInvisible"}, func() store.Store {
		return &rollbackCommits{AtomicStore: memstore.New().Atomic()}
	}, []storetest.Option{storetest.SerialWriters()}},
	{"SerialClaimsAfterWait", []string{"AtomicConcurrentClaim"}, func() store.Store {
		return newSerial(true)
	}, []storetest.Option{storetest.SerialWriters()}},
	{"ListSkipsTies", []string{"ListOrder"}, func() store.Store {
		return &listSkipsTies{Store: memstore.New()}
	}, nil},
	{"ListIgnoresExpiry", []string{"ListFilters"}, func() store.Store {
		return &listIgnoresExpiry{Store: memstore.New()}
	}, nil},
	{"ListReadsResponses", []string{"ListOrder", "ListFilters"}, func() store.Store {
		return &listReadsResponses{Store: memstore.New()}
	}, nil},
	{"ListUnchecked", []string{"ListInvalid"}, func() store.Store {
		return &listUnchecked{Store: memstore.New()}
	}, nil},
	{"VisitIgnoresSeen", []string{"SettleVisit"}, func() store.Store {
		return &visitIgnoresSeen{Store: memstore.New()}
	}, nil},
	{"DueIgnoresToken", []string{"SettleStale"}, func() store.Store {
		return &dueIgnoresToken{Store: memstore.New()}
	}, nil},
	{"ClaimIgnoresMark", []string{"SettleClaim"}, func() store.Store {
		return &claimIgnoresMark{Store: memstore.New()}
	}, nil},
	{"ClaimMarksAlways", []string{"SettleClaim"}, func() store.Store {
		return &claimMarksAlways{Store: memstore.New()}
	}, nil},
}

// A store that makes claims wait for an open transaction, as SQLite does,
// passes the suite when it declares SerialWriters; so does a store that
// answers at once.
func TestSerialWriters(t *testing.T) {
	t.Run("serial", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store { return newSerial(false) }, storetest.SerialWriters())
	})
	t.Run("memstore", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store { return memstore.New().Atomic() }, storetest.SerialWriters())
	})
}

// TestSuiteCatchesMutants runs the suite against each mutant in a child
// process (a failing subtest cannot be observed from inside one) and checks
// that the expected cases fail and print their rule.
func TestSuiteCatchesMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite in child processes")
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMutantProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), "STORETEST_MUTANT="+m.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store that breaks a rule on purpose:\n%s", out)
			}
			for _, c := range m.fails {
				if !strings.Contains(string(out), "--- FAIL: TestMutantProcess/"+c+" ") {
					t.Errorf("case %s did not fail", c)
				}
			}
			if !strings.Contains(string(out), "rule: ") {
				t.Error("no failing case printed its rule")
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

// TestMutantProcess is the child process of TestSuiteCatchesMutants; it
// does nothing in a normal run.
func TestMutantProcess(t *testing.T) {
	name := os.Getenv("STORETEST_MUTANT")
	if name == "" {
		return
	}
	for _, m := range mutants {
		if m.name == name {
			storetest.Run(t, func(t *testing.T) store.Store { return m.build() }, m.opts...)
			return
		}
	}
	t.Fatalf("unknown mutant %q", name)
}

// ignoreToken completes with whatever token holds the record.
type ignoreToken struct{ *memstore.Store }

func (s *ignoreToken) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	if r, err := s.Store.Get(ctx, id, time.Time{}); err == nil {
		token = r.Token
	}
	return s.Store.Complete(ctx, id, token, c)
}

// checkThenAct believes its own earlier read: a claim it saw as absent is
// reported as claimed.
type checkThenAct struct{ *memstore.Store }

func (s *checkThenAct) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	_, err := s.Store.Get(ctx, req.ID, req.Now)
	absent := errors.Is(err, core.ErrNotFound)
	runtime.Gosched()
	res, err := s.Store.Claim(ctx, req)
	if absent && err == nil && !res.Claimed {
		res.Claimed = true
	}
	return res, err
}

// ignoreExpiry reads expired records.
type ignoreExpiry struct{ *memstore.Store }

func (s *ignoreExpiry) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	return s.Store.Get(ctx, id, time.Time{})
}

// ignoreLimit deletes every expired record at once.
type ignoreLimit struct{ *memstore.Store }

func (s *ignoreLimit) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	return s.Store.DeleteExpired(ctx, now, 1<<30)
}

// seconds keeps times to the second, as a DATETIME column without
// fractional seconds does.
type seconds struct{ *memstore.Store }

func (s *seconds) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	req.Now = req.Now.Truncate(time.Second)
	req.LeaseUntil = req.LeaseUntil.Truncate(time.Second)
	req.ExpiresAt = req.ExpiresAt.Truncate(time.Second)
	return s.Store.Claim(ctx, req)
}

func (s *seconds) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	c.ExpiresAt = c.ExpiresAt.Truncate(time.Second)
	return s.Store.Complete(ctx, id, token, c)
}

// aliasing keeps the caller's response slice and returns it from Get.
type aliasing struct {
	*memstore.Store
	mu   sync.Mutex
	kept map[store.ID][]byte
}

func (s *aliasing) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	err := s.Store.Complete(ctx, id, token, c)
	if err == nil {
		s.mu.Lock()
		s.kept[id] = c.Response
		s.mu.Unlock()
	}
	return err
}

func (s *aliasing) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	r, err := s.Store.Get(ctx, id, now)
	s.mu.Lock()
	if b, ok := s.kept[id]; ok && err == nil {
		r.Response = b
	}
	s.mu.Unlock()
	return r, err
}

// ignoreCancel never looks at its context.
type ignoreCancel struct{ *memstore.Store }

func (s *ignoreCancel) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	return s.Store.Claim(context.WithoutCancel(ctx), req)
}

func (s *ignoreCancel) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	return s.Store.Get(context.WithoutCancel(ctx), id, now)
}

// rollbackCommits commits when asked to roll back.
type rollbackCommits struct{ *memstore.AtomicStore }

func (s *rollbackCommits) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	tctx, tx, err := s.AtomicStore.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	return tctx, commitOnly{tx}, nil
}

type commitOnly struct{ store.Tx }

func (tx commitOnly) Rollback() error {
	if err := tx.Commit(); !errors.Is(err, memstore.ErrTxDone) {
		return err
	}
	return nil
}

// serial admits one writer at a time, as SQLite does: a transaction takes
// the write lock at Begin and keeps it until it ends, a write outside any
// transaction takes it for its own duration, and reads never wait. A
// duplicate claim therefore waits for an open transaction and then answers
// from its outcome; with claimsAfterWait (broken) a claim that had to wait
// reports that it claimed.
type serial struct {
	*memstore.AtomicStore
	lock            chan struct{}
	claimsAfterWait bool
}

func newSerial(claimsAfterWait bool) *serial {
	return &serial{AtomicStore: memstore.New().Atomic(), lock: make(chan struct{}, 1), claimsAfterWait: claimsAfterWait}
}

// acquire takes the write lock; waited reports that it was taken.
func (s *serial) acquire(ctx context.Context) (waited bool, err error) {
	select {
	case s.lock <- struct{}{}:
		return false, nil
	default:
	}
	select {
	case s.lock <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return true, fmt.Errorf("%w: %w", core.ErrStoreUnavailable, ctx.Err())
	}
}

func (s *serial) release() { <-s.lock }

// write runs fn under the write lock unless ctx carries a transaction,
// which holds it already.
func (s *serial) write(ctx context.Context, fn func() error) (waited bool, err error) {
	if s.InTx(ctx) {
		return false, fn()
	}
	if waited, err = s.acquire(ctx); err != nil {
		return waited, err
	}
	defer s.release()
	return waited, fn()
}

func (s *serial) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	if _, err := s.acquire(ctx); err != nil {
		return ctx, nil, err
	}
	tctx, tx, err := s.AtomicStore.Begin(ctx)
	if err != nil {
		s.release()
		return ctx, nil, err
	}
	return tctx, &serialTx{Tx: tx, release: sync.OnceFunc(s.release)}, nil
}

type serialTx struct {
	store.Tx
	release func()
}

func (tx *serialTx) Commit() error {
	defer tx.release()
	return tx.Tx.Commit()
}

func (tx *serialTx) Rollback() error {
	defer tx.release()
	return tx.Tx.Rollback()
}

func (s *serial) Claim(ctx context.Context, req store.ClaimRequest) (res store.ClaimResult, err error) {
	waited, err := s.write(ctx, func() error {
		res, err = s.AtomicStore.Claim(ctx, req)
		return err
	})
	if waited && err == nil && s.claimsAfterWait {
		res.Claimed = true
	}
	return res, err
}

func (s *serial) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	_, err := s.write(ctx, func() error { return s.AtomicStore.Complete(ctx, id, token, c) })
	return err
}

func (s *serial) Extend(ctx context.Context, id store.ID, token int64, leaseUntil time.Time) error {
	_, err := s.write(ctx, func() error { return s.AtomicStore.Extend(ctx, id, token, leaseUntil) })
	return err
}

func (s *serial) Release(ctx context.Context, id store.ID, token int64) error {
	_, err := s.write(ctx, func() error { return s.AtomicStore.Release(ctx, id, token) })
	return err
}

func (s *serial) DeleteExpired(ctx context.Context, now time.Time, limit int) (n int, err error) {
	_, err = s.write(ctx, func() error {
		n, err = s.AtomicStore.DeleteExpired(ctx, now, limit)
		return err
	})
	return n, err
}

// listSkipsTies pages on CreatedAt alone: the rest of a tie after the
// cursor is lost.
type listSkipsTies struct{ *memstore.Store }

func (s *listSkipsTies) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if !q.After.IsZero() {
		for i := range q.After.ID {
			q.After.ID[i] = 0xff
		}
	}
	return s.Store.List(ctx, q)
}

// listIgnoresExpiry lists expired records too.
type listIgnoresExpiry struct{ *memstore.Store }

func (s *listIgnoresExpiry) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	q.Now = time.Time{}
	return s.Store.List(ctx, q)
}

// listReadsResponses returns each record's response with it.
type listReadsResponses struct{ *memstore.Store }

func (s *listReadsResponses) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	recs, err := s.Store.List(ctx, q)
	for i := range recs {
		if r, err := s.Store.Get(ctx, recs[i].ID, q.Now); err == nil {
			recs[i].Response = r.Response
		}
	}
	return recs, err
}

// listUnchecked answers any query: an unknown state lists nothing, a bad
// limit is replaced.
type listUnchecked struct{ *memstore.Store }

func (s *listUnchecked) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if q.Limit < 1 || q.Limit > store.MaxListLimit {
		q.Limit = store.MaxListLimit
	}
	if q.Check() != nil {
		return nil, nil
	}
	return s.Store.List(ctx, q)
}

// visitIgnoresSeen moves a mark whatever After it was read with: two
// completers would both visit it.
type visitIgnoresSeen struct{ *memstore.Store }

func (s *visitIgnoresSeen) Visit(ctx context.Context, id store.ID, token int64, _, next time.Time, tries int) (bool, error) {
	due, err := s.Store.Due(ctx, next.Add(100*365*24*time.Hour), store.MaxListLimit)
	if err != nil {
		return false, err
	}
	for _, p := range due {
		if p.Record.ID == id {
			return s.Store.Visit(ctx, id, token, p.Mark.After, next, tries)
		}
	}
	return false, nil
}

// dueIgnoresToken returns the marks of records claimed again under
// another token: a completer would settle a record with another route's
// mark. It remembers each mark's token and rewrites it to the record's.
type dueIgnoresToken struct{ *memstore.Store }

func (s *dueIgnoresToken) Mark(ctx context.Context, id store.ID, _ int64, m store.Mark) error {
	rec, err := s.Store.Get(ctx, id, time.Time{})
	if err != nil {
		return s.Store.Mark(ctx, id, 0, m)
	}
	return s.Store.Mark(ctx, id, rec.Token, m)
}

// claimIgnoresMark claims without writing the claim's mark: the engine
// would have to write it in a second statement, and a crash between the
// two would leave a record that no completer finds.
type claimIgnoresMark struct{ *memstore.Store }

func (s *claimIgnoresMark) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	req.Mark = nil
	return s.Store.Claim(ctx, req)
}

// claimMarksAlways writes the claim's mark even when the claim does not
// claim: a duplicate would replace the holder's mark with its own.
type claimMarksAlways struct{ *memstore.Store }

func (s *claimMarksAlways) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err == nil && !res.Claimed && req.Mark != nil {
		err = s.Store.Mark(ctx, req.ID, req.Token, *req.Mark)
	}
	return res, err
}
