package dbtest_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/inflight"
	"github.com/idemkit/idem/sqlstore"
)

// The registry of in-flight ids and the lazy Begin (registry.go), on every
// database.

// failsafe bounds a wait that must end.
const failsafe = 5 * time.Second

func regClaim(key string, token int64) store.ClaimRequest {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	return store.ClaimRequest{ID: store.Identity{Caller: "c", Scope: "POST /x", Key: key}.ID(), Caller: "c", Scope: "POST /x", Key: key,
		Token: token, Now: now, ExpiresAt: now.Add(time.Hour)}
}

func TestLazyBegin(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) { testLazyBegin(t, d) })
	}
}

func testLazyBegin(t *testing.T, d sqlstore.Dialect) {
	ctx := t.Context()
	t.Run("ok, Begin takes no connection; the claim does; commit and rollback of a transaction that never began are no-ops", func(t *testing.T) {
		s, db, _ := newStore(t, d)
		db.SetMaxIdleConns(0)
		tctx, tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := db.Stats().InUse; n != 0 {
			t.Fatalf("%d connections in use after Begin, want 0", n)
		}
		if !s.InTx(tctx) {
			t.Fatal("InTx is false for Begin's context")
		}
		if res, err := s.Claim(tctx, regClaim("lazy", 1)); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v, %v", res, err)
		}
		if n := db.Stats().InUse; n != 1 {
			t.Fatalf("%d connections in use after the claim, want 1", n)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); !errors.Is(err, sql.ErrTxDone) {
			t.Fatalf("Rollback after Commit: %v, want sql.ErrTxDone", err)
		}
		_, tx, err = s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatalf("Rollback of a transaction that never began: %v", err)
		}
		if err := tx.Commit(); !errors.Is(err, sql.ErrTxDone) {
			t.Fatalf("Commit after Rollback: %v, want sql.ErrTxDone", err)
		}
	})
	t.Run("ok, TxFrom begins a transaction Begin deferred", func(t *testing.T) {
		s, _, _ := newStore(t, d)
		tctx, tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		sqlTx := sqlstore.TxFrom(tctx)
		if sqlTx == nil {
			t.Fatal("TxFrom: nil")
		}
		if again := sqlstore.TxFrom(tctx); again != sqlTx {
			t.Fatal("TxFrom returned another transaction the second time")
		}
		if res, err := s.Claim(tctx, regClaim("txfrom", 1)); err != nil || !res.Claimed {
			t.Fatalf("claim in the begun transaction: %+v, %v", res, err)
		}
	})
}

func TestRegistry(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) { testRegistry(t, d) })
	}
}

func testRegistry(t *testing.T, d sqlstore.Dialect) {
	ctx := t.Context()
	t.Run("ok, duplicates that arrive together: one claims, the others answer in progress without a statement", func(t *testing.T) {
		s, db, counter := newStore(t, d)
		// The winner's claim: one statement (the INSERT; MySQL, not
		// MariaDB: two, probe and insert).
		want := int64(1)
		if d == sqlstore.MySQL {
			var v string
			if err := db.QueryRowContext(ctx, `SELECT version()`).Scan(&v); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(v, "MariaDB") {
				want = 2
			}
		}
		const n = 20
		before := counter.Statements()
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			claimed  int
			inFlight int
			slow     int64 // claims that may have peeked (see peekBound)
			txs      []store.Tx
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
		stmts := counter.Statements() - before
		for _, tx := range txs {
			_ = tx.Rollback()
		}
		if claimed != 1 || inFlight != n-1 {
			t.Fatalf("%d claimed, %d in progress; want 1 and %d", claimed, inFlight, n-1)
		}
		// A duplicate that waited ClaimWait for the winner's claim
		// statement (a busy machine) reads the committed row once (the
		// registry's peek), and only such a one.
		if stmts < want || stmts > want+slow {
			t.Errorf("%d statements for %d claims of one id, want %d (the winner's claim) plus at most one for each of the %d that waited %v", stmts, n, want, slow, inflight.ClaimWait)
		}
	})
	t.Run("ok, retries of a completed request that arrive together read its row once per wave, each gets its own copy", func(t *testing.T) {
		s, _, counter := newStore(t, d)
		first := regClaim("storm", 1)
		if res, err := s.Claim(ctx, first); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v, %v", res, err)
		}
		body := []byte(`{"id":"or_1"}`)
		if err := s.Complete(ctx, first.ID, 1, store.Completion{State: store.StateCompleted, Status: 201, Response: body, ExpiresAt: first.ExpiresAt}); err != nil {
			t.Fatal(err)
		}
		const n = 40
		before := counter.Statements()
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			got  [][]byte
			bad  int
			slow int64 // claims that may have peeked
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
				defer tx.Rollback()
				began := time.Now()
				res, err := s.Claim(tctx, regClaim("storm", int64(i+2)))
				took := time.Since(began)
				mu.Lock()
				defer mu.Unlock()
				if took >= inflight.ClaimWait {
					slow++
				}
				if err != nil || res.Claimed || res.Record.State != store.StateCompleted || !bytes.Equal(res.Record.Response, body) {
					bad++
					t.Errorf("claim %d: %+v, %v; want the completed record", i, res, err)
					return
				}
				got = append(got, res.Record.Response)
			})
		}
		close(start)
		wg.Wait()
		stmts := counter.Statements() - before
		t.Logf("%d claims of one completed id that arrived together: %d statements, %d waited %v", n, stmts, slow, inflight.ClaimWait)
		// A claim that waited ClaimWait for another's claim statement (a
		// busy machine) reads the committed row itself (the registry's
		// peek, one statement); the others share one read per wave.
		if bad == 0 && stmts-slow >= n {
			t.Errorf("%d statements for %d claims that arrived together (%d waited %v): every claim read the row", stmts, n, slow, inflight.ClaimWait)
		}
		for i := range got { // no two callers share a slice
			got[i][0] = byte('a' + i%26)
		}
		for i := range got {
			if got[i][0] != byte('a'+i%26) {
				t.Fatalf("claims %d and another share their response slice", i)
			}
		}
	})
	t.Run("ok, an id leaves the registry when its transaction's context ends", func(t *testing.T) {
		s, _, _ := newStore(t, d)
		actx, cancel := context.WithCancel(ctx)
		tctx, _, err := s.Begin(actx) // never committed nor rolled back
		if err != nil {
			t.Fatal(err)
		}
		if res, err := s.Claim(tctx, regClaim("cancelled", 1)); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v, %v", res, err)
		}
		if res, err := s.Claim(ctx, regClaim("cancelled", 2)); err != nil || res.Claimed || res.Record.State != store.StateInProgress {
			t.Fatalf("duplicate while the transaction is open: %+v, %v", res, err)
		}
		cancel() // database/sql rolls the transaction back, the registry forgets (both asynchronously)
		deadline := time.Now().Add(failsafe)
		for {
			res, err := s.Claim(ctx, regClaim("cancelled", 3))
			if err == nil && res.Claimed {
				break
			}
			if err != nil || res.Record.State != store.StateInProgress || time.Now().After(deadline) {
				t.Fatalf("claim after the context ended: %+v, %v", res, err)
			}
			time.Sleep(time.Millisecond)
		}
	})
	t.Run("ok, a transaction of one store claimed through another store leaves no trace in either registry", func(t *testing.T) {
		a, _, _, twin := newStoreAt(t, d)
		b := twin(t)
		actx, atx, err := a.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := b.Claim(actx, regClaim("across", 1)); err != nil || !res.Claimed {
			t.Fatalf("claim through the other store: %+v, %v", res, err)
		}
		if err := b.Complete(actx, regClaim("across", 1).ID, 1, store.Completion{State: store.StateCompleted, Status: 201, ExpiresAt: regClaim("", 0).ExpiresAt}); err != nil {
			t.Fatal(err)
		}
		if err := atx.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, s := range []*sqlstore.Store{a, b} {
			res, err := s.Claim(ctx, regClaim("across", 2))
			if err != nil || res.Claimed || res.Record.State != store.StateCompleted {
				t.Fatalf("duplicate after the commit: %+v, %v; want the completed record", res, err)
			}
		}
	})
}
