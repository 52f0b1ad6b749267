package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// The cases of atomic mode, for stores that implement store.TxStore. Each is
// listed, with its rule, in the cases table of storetest.go.

// atomicClaim returns an atomic-mode claim (no lease) of id by token at now.
func atomicClaim(id store.ID, token int64, now time.Time) store.ClaimRequest {
	req := claimAt(id, token, now)
	req.LeaseUntil = time.Time{}
	return req
}

// begin starts a transaction and rolls it back at the end of the test if
// the case has not ended it.
func begin(t *testing.T, s store.TxStore) (context.Context, store.Tx) {
	t.Helper()
	ctx, tx, err := s.Begin(t.Context())
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return ctx, tx
}

func testAtomicRollback(t *testing.T, s store.TxStore, _ config) {
	ctx := t.Context()
	id := newID("atomic-rollback", 0)
	tctx, tx := begin(t, s)
	mustClaim(t, tctx, s, atomicClaim(id, 101, at(0)))
	wantOK(t, "Rollback", tx.Rollback())
	wantAbsent(t, ctx, s, id, at(time.Second))
	again := atomicClaim(id, 102, at(time.Second))
	checkRecord(t, "Claim result after the rollback", mustClaim(t, ctx, s, again), fresh(again))

	completedID := newID("atomic-rollback", 1)
	tctx, tx = begin(t, s)
	mustClaim(t, tctx, s, atomicClaim(completedID, 201, at(0)))
	wantOK(t, "Complete in the transaction", s.Complete(tctx, completedID, 201, done(at(time.Second), 201, "rolled back")))
	wantOK(t, "Rollback", tx.Rollback())
	wantAbsent(t, ctx, s, completedID, at(time.Second))
	again = atomicClaim(completedID, 202, at(2*time.Second))
	checkRecord(t, "Claim result after the rollback of a completion", mustClaim(t, ctx, s, again), fresh(again))
}

func testAtomicCommit(t *testing.T, s store.TxStore, _ config) {
	ctx := t.Context()
	id := newID("atomic-commit", 0)
	tctx, tx := begin(t, s)
	req := atomicClaim(id, 101, at(0))
	want := fresh(req)
	checkRecord(t, "Claim result in the transaction", mustClaim(t, tctx, s, req), want)
	checkRecord(t, "Get in the transaction after Claim", mustGet(t, tctx, s, id, at(0)), want)

	// The engine completes with context.WithoutCancel of the request's
	// context: the transaction must survive that.
	comp := done(at(time.Second), 201, `{"id":"or_1"}`)
	wantOK(t, "Complete in the transaction", s.Complete(context.WithoutCancel(tctx), id, 101, comp))
	want = completed(want, comp)
	checkRecord(t, "Get in the transaction after Complete", mustGet(t, tctx, s, id, at(time.Second)), want)
	wantOK(t, "Commit", tx.Commit())

	checkRecord(t, "Get after Commit", mustGet(t, ctx, s, id, at(time.Second)), want)
	dup := atomicClaim(id, 102, at(2*time.Second))
	checkRecord(t, "Claim result of a duplicate after Commit", mustNotClaim(t, ctx, s, dup), want)
}

// wantHeld fails t unless res reports the identity id as held by a running
// attempt, as a lock probe does.
func wantHeld(t *testing.T, what string, id store.ID, res store.ClaimResult, err error) {
	t.Helper()
	switch {
	case err != nil:
		t.Errorf("%s: %v", what, err)
	case res.Claimed:
		t.Errorf("%s: Claimed = true while another transaction holds the claim", what)
	case res.Record.ID != id || res.Record.State != store.StateInProgress:
		t.Errorf("%s: record %s, want ID %s in progress", what, describe(res.Record), short(id))
	case len(res.Record.Response) > 0 || res.Record.Status != 0:
		t.Errorf("%s: the record carries a response (status %d, %d bytes) that is not committed",
			what, res.Record.Status, len(res.Record.Response))
	}
}

func testAtomicConcurrentClaim(t *testing.T, s store.TxStore, cfg config) {
	ctx := t.Context()
	id, other := newID("atomic-concurrent", 0), newID("atomic-concurrent", 1)
	tctx, tx := begin(t, s)
	mustClaim(t, tctx, s, atomicClaim(id, 101, at(0)))

	fromTx := func(ctx context.Context) (store.ClaimResult, error) {
		tctx2, tx2, err := s.Begin(ctx)
		if err != nil {
			return store.ClaimResult{}, fmt.Errorf("Begin: %w", err)
		}
		defer func() { _ = tx2.Rollback() }()
		return s.Claim(tctx2, atomicClaim(id, 102, at(time.Millisecond)))
	}
	outside := func(ctx context.Context) (store.ClaimResult, error) {
		return s.Claim(ctx, atomicClaim(id, 103, at(2*time.Millisecond)))
	}
	otherID := func(ctx context.Context) (store.ClaimResult, error) {
		return s.Claim(ctx, atomicClaim(other, 104, at(3*time.Millisecond)))
	}
	comp := done(at(time.Second), 201, `{"id":"or_1"}`)
	commit := func() error {
		if err := s.Complete(tctx, id, 101, comp); err != nil {
			return fmt.Errorf("Complete in the first transaction: %w", err)
		}
		return tx.Commit()
	}

	if cfg.serialWriters {
		names := []string{"Claim from a second transaction", "Claim outside any transaction", "Claim of another ID outside any transaction"}
		out := besideTx(t, []func(context.Context) (store.ClaimResult, error){fromTx, outside, otherID}, commit)
		for i, o := range out[:2] {
			wantHeldOrOutcome(t, names[i], id, o, func(res store.ClaimResult) bool {
				return !res.Claimed && res.Record.State == store.StateCompleted && res.Record.Token == 101
			}, "the committed record (completed, token 101)")
		}
		if o := out[2]; o.err != nil || !o.res.Claimed {
			t.Errorf("%s = (Claimed %v, %v), want it claimed (after the transaction ended, at the latest)", names[2], o.res.Claimed, o.err)
		}
	} else {
		what := "Claim from a second transaction"
		res, err := within(t, what, fromTx)
		wantHeld(t, what, id, res, err)

		what = "Claim outside any transaction"
		res, err = within(t, what, outside)
		wantHeld(t, what, id, res, err)

		what = "Claim of another ID outside any transaction"
		res, err = within(t, what, otherID)
		if err != nil || !res.Claimed {
			t.Errorf("%s = (Claimed %v, %v), want it claimed", what, res.Claimed, err)
		}
		wantOK(t, "Commit", commit())
	}
	if r := mustGet(t, ctx, s, id, at(time.Second)); r.State != store.StateCompleted || r.Token != 101 {
		t.Errorf("Get after Commit: %s, want completed with token 101", describe(r))
	}
}

// serialGrace is how long besideTx lets claims run beside an open
// transaction before it ends it: long enough for a store that answers at
// once to answer, so that the check of that answer is the strict one.
const serialGrace = 300 * time.Millisecond

// besideOutcome is what a claim run by besideTx returned, and whether it
// returned before the transaction began to end.
type besideOutcome struct {
	res   store.ClaimResult
	err   error
	early bool
}

// besideTx runs claims, each in its own goroutine, beside an open
// transaction that (SerialWriters) may make them wait. When all have
// returned, or after serialGrace, it calls end (which commits or rolls the
// transaction back) and then waits for the others, failing t if one has not
// returned after the failsafe timeout.
func besideTx(t *testing.T, claims []func(ctx context.Context) (store.ClaimResult, error), end func() error) []besideOutcome {
	t.Helper()
	type result struct {
		i   int
		res store.ClaimResult
		err error
	}
	ch := make(chan result, len(claims))
	ctx := t.Context()
	for i, f := range claims {
		go func() {
			res, err := f(ctx)
			ch <- result{i, res, err}
		}()
	}
	out := make([]besideOutcome, len(claims))
	got := 0
	grace := time.NewTimer(serialGrace)
	defer grace.Stop()
wait:
	for got < len(claims) {
		select {
		case r := <-ch:
			out[r.i] = besideOutcome{r.res, r.err, true}
			got++
		case <-grace.C:
			break wait
		}
	}
	wantOK(t, "ending the transaction", end())
	failsafeT := time.NewTimer(failsafe)
	defer failsafeT.Stop()
	for got < len(claims) {
		select {
		case r := <-ch:
			out[r.i] = besideOutcome{r.res, r.err, false}
			got++
		case <-failsafeT.C:
			t.Fatalf("%d claims have not returned %v after the transaction ended: the store blocks", len(claims)-got, failsafe)
		}
	}
	return out
}

// wantHeldOrOutcome checks a claim of id run by besideTx (SerialWriters):
// answered while the transaction was open, it must report id in progress
// (wantHeld); answered later, either that or the outcome of the
// transaction, which outcome checks (want describes it).
func wantHeldOrOutcome(t *testing.T, what string, id store.ID, o besideOutcome, outcome func(store.ClaimResult) bool, want string) {
	t.Helper()
	if o.early || o.err != nil || (!o.res.Claimed && o.res.Record.State == store.StateInProgress) {
		wantHeld(t, what, id, o.res, o.err)
		return
	}
	if !outcome(o.res) {
		t.Errorf("%s, answered after the transaction ended: Claimed %v, record %s; want in progress or %s",
			what, o.res.Claimed, describe(o.res.Record), want)
	}
}

func testAtomicUncommittedInvisible(t *testing.T, s store.TxStore, cfg config) {
	ctx := t.Context()
	id := newID("atomic-invisible", 0)
	tctx, tx := begin(t, s)
	mustClaim(t, tctx, s, atomicClaim(id, 101, at(0)))
	wantOK(t, "Complete in the transaction", s.Complete(tctx, id, 101, done(at(time.Second), 201, `{"id":"or_1"}`)))

	what := "Get outside the transaction"
	r, err := within(t, what, func(ctx context.Context) (store.Record, error) {
		return s.Get(ctx, id, at(time.Second))
	})
	switch {
	case errors.Is(err, core.ErrNotFound):
	case err != nil:
		t.Errorf("%s: %v, want ErrNotFound", what, err)
	case r.State == store.StateCompleted || len(r.Response) > 0:
		t.Errorf("%s: %s with a %d-byte response, want ErrNotFound: the completion is not committed",
			what, describe(r), len(r.Response))
	}

	what = "Claim outside the transaction"
	again := claimAt(id, 102, at(time.Second))
	outside := func(ctx context.Context) (store.ClaimResult, error) { return s.Claim(ctx, again) }
	if !cfg.serialWriters {
		res, err := within(t, what, outside)
		wantHeld(t, what, id, res, err)
		wantOK(t, "Rollback", tx.Rollback())
		wantAbsent(t, ctx, s, id, at(time.Second))
		return
	}
	o := besideTx(t, []func(context.Context) (store.ClaimResult, error){outside}, tx.Rollback)[0]
	claimedAfter := func(res store.ClaimResult) bool { return res.Claimed }
	wantHeldOrOutcome(t, what, id, o, claimedAfter, "a new claim (the transaction rolled back)")
	if o.err == nil && o.res.Claimed {
		checkRecord(t, what+", claimed after the rollback", o.res.Record, fresh(again))
		checkRecord(t, "Get after the rollback and the new claim", mustGet(t, ctx, s, id, at(time.Second)), fresh(again))
		return
	}
	wantAbsent(t, ctx, s, id, at(time.Second))
}

func testAtomicClaimRace(t *testing.T, s store.TxStore, cfg config) {
	ctx := t.Context()
	type outcome struct {
		res store.ClaimResult
		err error
	}
	for n := range 2 {
		id := newID("atomic-race", n)
		out, _ := within(t, "concurrent transactions", func(ctx context.Context) ([]outcome, error) {
			out := make([]outcome, racers)
			st := cfg.racer(t, s)
			race(racers, func(i int) {
				token := raceToken(n, i)
				s := st(i).(store.TxStore)
				tctx, tx, err := s.Begin(ctx)
				if err != nil {
					out[i].err = fmt.Errorf("Begin: %w", err)
					return
				}
				defer func() { _ = tx.Rollback() }()
				res, err := s.Claim(tctx, atomicClaim(id, token, at(0)))
				out[i] = outcome{res, err}
				if err != nil || !res.Claimed {
					return
				}
				if err := s.Complete(tctx, id, token, done(at(0), 201, "")); err != nil {
					out[i].err = fmt.Errorf("Complete: %w", err)
					return
				}
				if err := tx.Commit(); err != nil {
					out[i].err = fmt.Errorf("Commit: %w", err)
				}
			})
			return out, nil
		})
		winner := -1
		for i, o := range out {
			switch {
			case cfg.lostOK(o.err):
				// Another node's claim was certified first: rolled back.
			case o.err != nil:
				t.Errorf("racer %d: %v", i, o.err)
			case o.res.Claimed && winner >= 0:
				t.Errorf("racers %d and %d both claimed %s", winner, i, short(id))
			case o.res.Claimed:
				winner = i
			case o.res.Record.State != store.StateInProgress && o.res.Record.State != store.StateCompleted:
				t.Errorf("racer %d: existing record %s, want in progress or completed", i, describe(o.res.Record))
			}
		}
		if winner < 0 {
			t.Errorf("none of %d transactions claimed %s", racers, short(id))
			continue
		}
		if r := mustGet(t, ctx, s, id, at(0)); r.State != store.StateCompleted || r.Token != raceToken(n, winner) {
			t.Errorf("Get after the race: %s, want completed by the winner (token %d)", describe(r), raceToken(n, winner))
		}
	}
}

type otherKey struct{}

func testAtomicInTx(t *testing.T, s store.TxStore, _ config) {
	ctx := t.Context()
	if s.InTx(ctx) {
		t.Error("InTx(test context) = true, want false")
	}
	if s.InTx(context.Background()) {
		t.Error("InTx(context.Background()) = true, want false")
	}
	tctx, tx := begin(t, s)
	if !s.InTx(tctx) {
		t.Error("InTx(context from Begin) = false, want true")
	}
	derived, cancel := context.WithCancel(context.WithValue(tctx, otherKey{}, 1))
	defer cancel()
	if !s.InTx(derived) {
		t.Error("InTx(context derived from Begin's) = false, want true")
	}
	if !s.InTx(context.WithoutCancel(tctx)) {
		t.Error("InTx(context.WithoutCancel(context from Begin)) = false, want true")
	}
	if s.InTx(ctx) {
		t.Error("InTx(test context) = true during a transaction begun from it, want false")
	}
	wantOK(t, "Rollback", tx.Rollback())
}
