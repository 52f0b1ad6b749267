package pgxstore_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/inflight"
	"github.com/idemkit/idem/pgxstore"
)

func regClaim(key string, token int64) store.ClaimRequest {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	return store.ClaimRequest{ID: store.Identity{Caller: "c", Scope: "POST /x", Key: key}.ID(), Caller: "c", Scope: "POST /x", Key: key,
		Token: token, Now: now, ExpiresAt: now.Add(time.Hour)}
}

// TestLazyBegin: Begin takes no connection, the claim takes one; Commit
// and Rollback of a transaction that never began are no-ops, and a second
// end says the transaction has ended.
func TestLazyBegin(t *testing.T) {
	ctx := t.Context()
	s, pool, _ := newStore(t)
	tctx, tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections acquired after Begin, want 0", n)
	}
	if !s.InTx(tctx) || s.InTx(s.WithoutTx(tctx)) {
		t.Fatal("InTx: want true for Begin's context and false once WithoutTx hid it")
	}
	if res, err := s.Claim(tctx, regClaim("lazy", 1)); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if n := pool.Stat().AcquiredConns(); n != 1 {
		t.Fatalf("%d connections acquired after the claim, want 1", n)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections acquired after Commit, want 0", n)
	}
	if err := tx.Rollback(); err == nil {
		t.Fatal("Rollback after Commit: nil, want an error")
	}
	_, tx, _ = s.Begin(ctx)
	if err := tx.Rollback(); err != nil {
		t.Fatalf("Rollback of a transaction that never began: %v", err)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("Commit after Rollback: nil, want an error")
	}
}

// TestRegistry: duplicates of one id that arrive together in this
// process: one claims, the others answer in progress from the registry,
// without a connection or a round trip (the pool has one connection, which
// the winner holds).
func TestRegistry(t *testing.T) {
	ctx := t.Context()
	setup, _, _ := newStore(t)
	pool, rt := countedPool(t)
	s, err := pgxstore.New(pool, pgxstore.WithTable(setup.Table()))
	if err != nil {
		t.Fatal(err)
	}
	release, wait := pgxstore.HoldRollbacks(s)
	release()
	// Warm the connection: BEGIN and the claim are prepared once.
	wctx, wtx, _ := s.Begin(ctx)
	if res, err := s.Claim(wctx, regClaim("warm", 1)); err != nil || !res.Claimed {
		t.Fatalf("warm-up claim: %+v, %v", res, err)
	}
	_ = wtx.Rollback()
	wait()

	const n = 20
	before := rt.count()
	var (
		wg                sync.WaitGroup
		mu                sync.Mutex
		claimed, inFlight int
		slow              int // claims that may have peeked
		txs               []store.Tx
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			tctx, tx, err := s.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			began := time.Now()
			res, err := s.Claim(tctx, regClaim("together", int64(i+1)))
			took := time.Since(began)
			mu.Lock()
			defer mu.Unlock()
			if took >= inflight.ClaimWait {
				slow++
			}
			switch {
			case err != nil:
				t.Error(err)
			case res.Claimed:
				claimed++
				txs = append(txs, tx) // held open until every claim returned
				return
			case res.Record.State == store.StateInProgress:
				inFlight++
			default:
				t.Errorf("claim %d: %+v", i, res)
			}
			_ = tx.Rollback()
		})
	}
	close(start)
	wg.Wait()
	trips := rt.count() - before
	for _, tx := range txs {
		_ = tx.Rollback()
	}
	wait()
	if claimed != 1 || inFlight != n-1 {
		t.Fatalf("%d claimed, %d in progress; want 1 and %d", claimed, inFlight, n-1)
	}
	// A duplicate that waited ClaimWait for the winner's claim (a busy
	// machine) reads the committed row once (the registry's peek), and
	// only such a one.
	if trips < 1 || trips > 1+slow {
		t.Errorf("%d round trips for %d claims of one id, want 1 (the winner's BEGIN and claim) plus at most one for each of the %d that waited %v", trips, n, slow, inflight.ClaimWait)
	}
}

// TestDeferredCompletion: the completion a transaction keeps for COMMIT
// is what a later statement of the same transaction sees, and a Complete
// with another token is fenced at once (it is not deferred).
func TestDeferredCompletion(t *testing.T) {
	ctx := t.Context()
	s, _, _ := newStore(t)
	req := regClaim("deferred", 7)
	tctx, tx, _ := s.Begin(ctx)
	defer func() { _ = tx.Rollback() }()
	if res, err := s.Claim(tctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	c := store.Completion{State: store.StateCompleted, Status: 201, Response: []byte("ok"), ExpiresAt: req.ExpiresAt}
	if err := s.Complete(tctx, req.ID, 8, c); !errors.Is(err, core.ErrFenced) {
		t.Fatalf("Complete with another token: %v, want core.ErrFenced", err)
	}
	if err := s.Complete(tctx, req.ID, 7, c); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(tctx, req.ID, req.Now)
	if err != nil || rec.State != store.StateCompleted || rec.Status != 201 || string(rec.Response) != "ok" {
		t.Fatalf("Get in the transaction after Complete: %+v, %v; want the completed record", rec, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, req.ID, req.Now); err != nil || rec.State != store.StateCompleted {
		t.Fatalf("Get after Commit: %+v, %v", rec, err)
	}
}

// TestCommitFencedCompletion: a completion sent with COMMIT that matches
// no row (its row was deleted in the transaction, behind the store's back,
// after Complete kept it; nothing else can remove it) stops the COMMIT: Commit fails with
// core.ErrFenced and nothing of the transaction commits.
func TestCommitFencedCompletion(t *testing.T) {
	ctx := t.Context()
	f := fixture(t)
	s := f.Store
	req := regClaim("fenced", 7)
	tctx, tx, _ := s.Begin(ctx)
	if res, err := s.Claim(tctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if err := f.Insert(tctx, "fenced"); err != nil {
		t.Fatal(err)
	}
	// The transaction's raw connection, taken before Complete: statements
	// run on it directly do not send the kept completion first.
	ptx, err := pgxstore.Tx(tctx)
	if err != nil {
		t.Fatal(err)
	}
	raw := ptx.Conn()
	c := store.Completion{State: store.StateCompleted, Status: 201, ExpiresAt: req.ExpiresAt}
	if err := s.Complete(tctx, req.ID, 7, c); err != nil {
		t.Fatal(err)
	}
	// Delete the row behind the store's back, in the transaction, so the
	// kept completion matches nothing.
	if _, err := raw.Exec(ctx, "DELETE FROM "+s.(*pgxstore.Store).Table()+" WHERE id = $1", req.ID[:]); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); !errors.Is(err, core.ErrFenced) {
		t.Fatalf("Commit = %v, want core.ErrFenced", err)
	}
	if n := f.Count(t, "fenced"); n != 0 {
		t.Fatalf("%d business rows committed, want 0", n)
	}
}

// TestEndedClaimHoldsNothing: a transaction whose claim did not claim ends
// after its answer (its ROLLBACK is held here), and still no other claim
// meets anything of it: a lapsed lease that one claim saw without
// Takeover is taken over at once by the next claim with Takeover, instead
// of being reported held by a transaction that has, for the engine, ended.
func TestEndedClaimHoldsNothing(t *testing.T) {
	ctx := t.Context()
	s, _, _ := newStore(t)
	release, wait := pgxstore.HoldRollbacks(s)
	defer wait()
	defer release()
	leased := regClaim("lapsed", 1)
	leased.LeaseUntil = leased.Now.Add(time.Second)
	if res, err := s.Claim(ctx, leased); err != nil || !res.Claimed {
		t.Fatalf("leased claim: %+v, %v", res, err)
	}
	later := regClaim("lapsed", 2)
	later.Now = leased.Now.Add(2 * time.Second) // the lease has lapsed
	later.LeaseUntil = later.Now.Add(time.Second)
	tctx, tx, _ := s.Begin(ctx)
	res, err := s.Claim(tctx, later) // no Takeover: the record as it is
	if err != nil || res.Claimed || res.Record.Token != 1 {
		t.Fatalf("claim without Takeover: %+v, %v; want the lapsed record", res, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	later.Token, later.Takeover = 3, true
	if res, err := s.Claim(ctx, later); err != nil || !res.Claimed {
		t.Fatalf("takeover after the first claim's transaction ended: %+v, %v; want claimed", res, err)
	}
}
