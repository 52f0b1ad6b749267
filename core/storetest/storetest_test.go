package storetest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
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
	build func() core.Store
}

var mutants = []mutant{
	{"CompleteIgnoresToken", []string{"Fencing", "Takeover", "ClaimExpired"}, func() core.Store {
		return &ignoreToken{Store: memstore.New()}
	}},
	{"ClaimCheckThenAct", []string{"ClaimRace"}, func() core.Store {
		return &checkThenAct{Store: memstore.New()}
	}},
	{"GetIgnoresExpiry", []string{"ExpiredIsAbsent"}, func() core.Store {
		return &ignoreExpiry{Store: memstore.New()}
	}},
	{"DeleteExpiredIgnoresLimit", []string{"DeleteExpiredBatches", "DeleteExpiredConcurrent"}, func() core.Store {
		return &ignoreLimit{Store: memstore.New()}
	}},
	{"SecondPrecision", []string{"ResponseBytes", "DeleteExpiredBatches"}, func() core.Store {
		return &seconds{Store: memstore.New()}
	}},
	{"ResponseAliased", []string{"NoAliasing"}, func() core.Store {
		return &aliasing{Store: memstore.New(), kept: make(map[core.ID][]byte)}
	}},
	{"IgnoresCancellation", []string{"CancelledContext"}, func() core.Store {
		return &ignoreCancel{Store: memstore.New()}
	}},
	{"RollbackCommits", []string{"AtomicRollback", "AtomicUncommittedInvisible"}, func() core.Store {
		return &rollbackCommits{AtomicStore: memstore.New().Atomic()}
	}},
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
			storetest.Run(t, func(t *testing.T) core.Store { return m.build() })
			return
		}
	}
	t.Fatalf("unknown mutant %q", name)
}

// ignoreToken completes with whatever token holds the record.
type ignoreToken struct{ *memstore.Store }

func (s *ignoreToken) Complete(ctx context.Context, id core.ID, token int64, c core.Completion) error {
	if r, err := s.Store.Get(ctx, id, time.Time{}); err == nil {
		token = r.Token
	}
	return s.Store.Complete(ctx, id, token, c)
}

// checkThenAct believes its own earlier read: a claim it saw as absent is
// reported as claimed.
type checkThenAct struct{ *memstore.Store }

func (s *checkThenAct) Claim(ctx context.Context, req core.ClaimRequest) (core.ClaimResult, error) {
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

func (s *ignoreExpiry) Get(ctx context.Context, id core.ID, now time.Time) (core.Record, error) {
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

func (s *seconds) Claim(ctx context.Context, req core.ClaimRequest) (core.ClaimResult, error) {
	req.Now = req.Now.Truncate(time.Second)
	req.LeaseUntil = req.LeaseUntil.Truncate(time.Second)
	req.ExpiresAt = req.ExpiresAt.Truncate(time.Second)
	return s.Store.Claim(ctx, req)
}

func (s *seconds) Complete(ctx context.Context, id core.ID, token int64, c core.Completion) error {
	c.ExpiresAt = c.ExpiresAt.Truncate(time.Second)
	return s.Store.Complete(ctx, id, token, c)
}

// aliasing keeps the caller's response slice and returns it from Get.
type aliasing struct {
	*memstore.Store
	mu   sync.Mutex
	kept map[core.ID][]byte
}

func (s *aliasing) Complete(ctx context.Context, id core.ID, token int64, c core.Completion) error {
	err := s.Store.Complete(ctx, id, token, c)
	if err == nil {
		s.mu.Lock()
		s.kept[id] = c.Response
		s.mu.Unlock()
	}
	return err
}

func (s *aliasing) Get(ctx context.Context, id core.ID, now time.Time) (core.Record, error) {
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

func (s *ignoreCancel) Claim(ctx context.Context, req core.ClaimRequest) (core.ClaimResult, error) {
	return s.Store.Claim(context.WithoutCancel(ctx), req)
}

func (s *ignoreCancel) Get(ctx context.Context, id core.ID, now time.Time) (core.Record, error) {
	return s.Store.Get(context.WithoutCancel(ctx), id, now)
}

// rollbackCommits commits when asked to roll back.
type rollbackCommits struct{ *memstore.AtomicStore }

func (s *rollbackCommits) Begin(ctx context.Context) (context.Context, core.Tx, error) {
	tctx, tx, err := s.AtomicStore.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	return tctx, commitOnly{tx}, nil
}

type commitOnly struct{ core.Tx }

func (tx commitOnly) Rollback() error {
	if err := tx.Commit(); !errors.Is(err, memstore.ErrTxDone) {
		return err
	}
	return nil
}
