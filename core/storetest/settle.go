package storetest

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// The cases of store.Settler (the completer's marks). Each is listed, with
// its rule, in the cases table of storetest.go; they are skipped for
// stores that do not implement store.Settler.

// settleCase adapts a case of store.Settler; it is skipped for stores that
// do not implement it.
func settleCase(fn func(t *testing.T, s store.Settler, cfg config)) func(t *testing.T, s store.Store, cfg config) {
	return func(t *testing.T, s store.Store, cfg config) {
		st, ok := s.(store.Settler)
		if !ok {
			t.Skipf("%T does not implement store.Settler: marks do not apply", s)
		}
		fn(t, st, cfg)
	}
}

// markOf returns a mark of route "payments", due at after, with a
// request of n bytes of every value.
func markOf(after time.Time, n int) store.Mark {
	req := make([]byte, n)
	for i := range req {
		req[i] = byte(i)
	}
	if n == 0 {
		req = nil
	}
	return store.Mark{Route: "payments", Request: req, After: after}
}

// mustDue runs Due and fails t on an error.
func mustDue(t *testing.T, s store.Settler, now time.Time, limit int) []store.Pending {
	t.Helper()
	due, err := s.Due(t.Context(), now, limit)
	if err != nil {
		t.Fatalf("Due(%v, %d): %v", now, limit, err)
	}
	return due
}

// dueIDs returns the IDs of due, in order.
func dueIDs(due []store.Pending) []string {
	out := make([]string, len(due))
	for i, p := range due {
		out[i] = short(p.Record.ID)
	}
	return out
}

func testSettleDue(t *testing.T, s store.Settler, _ config) {
	ctx := t.Context()
	var want []store.Pending
	// Three marks due at 3, 1 and 2 minutes, one due later; each record
	// in progress or indeterminate.
	for i, min := range []int{3, 1, 2, 10} {
		id := newID("SettleDue", i)
		rec := seedState(t, s, id, int64(100+i), at(0), []store.State{store.StateInProgress, store.StateIndeterminate}[i%2])
		m := markOf(at(time.Duration(min)*time.Minute), 300*i)
		m.Tries = i
		wantOK(t, "Mark", s.Mark(ctx, id, rec.Token, m))
		if min <= 3 {
			want = append(want, store.Pending{Record: listed(rec), Mark: m})
		}
	}
	want[0], want[1], want[2] = want[1], want[2], want[0] // by After
	got := mustDue(t, s, at(5*time.Minute), 10)
	if len(got) != len(want) {
		t.Fatalf("Due at 5m: %v, want the 3 marks due by then", dueIDs(got))
	}
	for i := range want {
		g, w := got[i], want[i]
		if !sameRecord(g.Record, w.Record) {
			t.Errorf("Due[%d].Record = %+v, want %+v (as Get reads it, without Response)", i, g.Record, w.Record)
		}
		if g.Mark.Route != w.Mark.Route || !bytes.Equal(g.Mark.Request, w.Mark.Request) || !g.Mark.After.Equal(w.Mark.After) || g.Mark.Tries != w.Mark.Tries {
			t.Errorf("Due[%d].Mark = {%q, %d bytes, %v, %d}, want {%q, %d bytes, %v, %d}", i,
				g.Mark.Route, len(g.Mark.Request), g.Mark.After, g.Mark.Tries, w.Mark.Route, len(w.Mark.Request), w.Mark.After, w.Mark.Tries)
		}
	}
	if got := mustDue(t, s, at(5*time.Minute), 2); len(got) != 2 || got[0].Record.ID != want[0].Record.ID {
		t.Errorf("Due with limit 2: %v, want the 2 earliest", dueIDs(got))
	}
	if got := mustDue(t, s, at(30*time.Second), 10); len(got) != 0 {
		t.Errorf("Due before any mark is due: %v, want none", dueIDs(got))
	}
	for _, limit := range []int{0, -1, store.MaxListLimit + 1} {
		if _, err := s.Due(ctx, at(time.Hour), limit); !errors.Is(err, core.ErrConfig) {
			t.Errorf("Due with limit %d: %v, want ErrConfig", limit, err)
		}
	}
}

// sameRecord compares records as the cases do: times by instant, byte
// slices by content.
func sameRecord(a, b store.Record) bool {
	return a.ID == b.ID && a.Caller == b.Caller && a.Scope == b.Scope && a.Key == b.Key &&
		bytes.Equal(a.Fingerprint, b.Fingerprint) && a.State == b.State && a.Token == b.Token &&
		a.Attempt == b.Attempt && a.LeaseUntil.Equal(b.LeaseUntil) && a.ExpiresAt.Equal(b.ExpiresAt) &&
		a.CreatedAt.Equal(b.CreatedAt) && a.Status == b.Status && bytes.Equal(a.Response, b.Response)
}

func testSettleStale(t *testing.T, s store.Settler, _ config) {
	ctx := t.Context()
	mark := func(i int, token int64) store.ID {
		id := newID("SettleStale", i)
		wantOK(t, "Mark", s.Mark(ctx, id, token, markOf(at(time.Minute), 8)))
		return id
	}
	// 0: indeterminate, 1: in progress with a lapsed lease: live marks.
	seedState(t, s, newID("SettleStale", 0), 10, at(0), store.StateIndeterminate)
	live0 := mark(0, 10)
	seedState(t, s, newID("SettleStale", 1), 11, at(0), store.StateInProgress)
	live1 := mark(1, 11)
	// 2: completed; 3: released; 4: never claimed; 5: claimed again under
	// another token (the mark's token is older); 6: expired.
	seedState(t, s, newID("SettleStale", 2), 12, at(0), store.StateInProgress)
	mark(2, 12)
	wantOK(t, "Complete", s.Complete(ctx, newID("SettleStale", 2), 12, done(at(time.Second), 201, "{}")))
	seedState(t, s, newID("SettleStale", 3), 13, at(0), store.StateInProgress)
	mark(3, 13)
	wantOK(t, "Release", s.Release(ctx, newID("SettleStale", 3), 13))
	mark(4, 14)
	seedState(t, s, newID("SettleStale", 5), 15, at(0), store.StateInProgress)
	mark(5, 99)
	req := claimAt(newID("SettleStale", 6), 16, at(0))
	req.ExpiresAt = at(2 * time.Minute)
	mustClaim(t, ctx, s, req)
	mark(6, 16)

	now := at(3 * time.Minute)
	got := mustDue(t, s, now, 100)
	ids := map[store.ID]bool{}
	for _, p := range got {
		ids[p.Record.ID] = true
	}
	if len(got) != 2 || !ids[live0] || !ids[live1] {
		t.Fatalf("Due: %v, want only the marks of the indeterminate record (%s) and the lapsed lease (%s)", dueIDs(got), short(live0), short(live1))
	}
	// Deleting the stale marks changed nothing of the live ones.
	if got := mustDue(t, s, now, 100); len(got) != 2 {
		t.Fatalf("Due again: %v, want the same 2", dueIDs(got))
	}
}

func testSettleVisit(t *testing.T, s store.Settler, cfg config) {
	ctx := t.Context()
	id := newID("SettleVisit", 0)
	seedState(t, s, id, 20, at(0), store.StateIndeterminate)
	m := markOf(at(time.Minute), 0)
	wantOK(t, "Mark", s.Mark(ctx, id, 20, m))
	visit := func(token int64, seen, next time.Time, tries int) bool {
		t.Helper()
		ok, err := s.Visit(ctx, id, token, seen, next, tries)
		if err != nil {
			t.Fatalf("Visit: %v", err)
		}
		return ok
	}
	if visit(21, m.After, at(5*time.Minute), 1) {
		t.Error("Visit with another token succeeded")
	}
	if visit(20, at(2*time.Minute), at(5*time.Minute), 1) {
		t.Error("Visit with another seen After succeeded")
	}
	if !visit(20, m.After, at(5*time.Minute), 1) {
		t.Fatal("Visit with the mark's token and After failed")
	}
	if got := mustDue(t, s, at(4*time.Minute), 10); len(got) != 0 {
		t.Fatalf("Due before the visit's next: %v, want none", dueIDs(got))
	}
	got := mustDue(t, s, at(5*time.Minute), 10)
	if len(got) != 1 || !got[0].Mark.After.Equal(at(5*time.Minute)) || got[0].Mark.Tries != 1 {
		t.Fatalf("Due after the visit: %+v, want After 5m and Tries 1", got)
	}
	if visit(20, m.After, at(9*time.Minute), 2) {
		t.Error("a second Visit with the first After succeeded")
	}
	// Concurrent visits of one mark read at one After: exactly one wins.
	seen := got[0].Mark.After
	var wins atomic.Int32
	var wg sync.WaitGroup
	racer := cfg.racer(t, s)
	for i := range 8 {
		wg.Go(func() {
			st, ok := racer(i).(store.Settler)
			if !ok {
				st = s
			}
			won, err := st.Visit(ctx, id, 20, seen, at(time.Duration(10+i)*time.Minute), 2)
			if err != nil && !cfg.lostOK(err) {
				t.Errorf("Visit %d: %v", i, err)
			}
			if won {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	if n := wins.Load(); n != 1 {
		t.Fatalf("%d concurrent visits won, want exactly 1", n)
	}
	// Mark replaces the mark (a takeover's, under a new token).
	wantOK(t, "Mark", s.Mark(ctx, id, 20, store.Mark{Route: "refunds", After: at(time.Minute)}))
	got = mustDue(t, s, at(time.Minute), 10)
	if len(got) != 1 || got[0].Mark.Route != "refunds" || got[0].Mark.Tries != 0 || len(got[0].Mark.Request) != 0 {
		t.Fatalf("Due after Mark replaced the mark: %+v, want the new mark", got)
	}
}

// dueOf returns the mark that Due finds for id at now, if any.
func dueOf(t *testing.T, s store.Settler, id store.ID, now time.Time) (store.Pending, bool) {
	t.Helper()
	for _, p := range mustDue(t, s, now, store.MaxListLimit) {
		if p.Record.ID == id {
			return p, true
		}
	}
	return store.Pending{}, false
}

func testSettleClaim(t *testing.T, s store.Settler, _ config) {
	ctx := t.Context()
	// A new record: its mark is due without any Mark call.
	id := newID("SettleClaim", 0)
	req := claimAt(id, 40, at(0))
	m := markOf(at(time.Minute), 300)
	m.Tries = 2
	want := m
	want.Request = bytes.Clone(m.Request)
	req.Mark = &m
	mustClaim(t, ctx, s, req)
	m.Request[0] ^= 0xff // the store keeps its own copy
	if _, ok := dueOf(t, s, id, at(59*time.Second)); ok {
		t.Errorf("Due before the mark's After listed %s", short(id))
	}
	p, ok := dueOf(t, s, id, at(2*time.Minute))
	switch {
	case !ok:
		t.Fatalf("Due after a claim with a mark: %s not listed, want its mark (written by Claim, no Mark call)", short(id))
	case !sameRecord(p.Record, listed(fresh(req))):
		t.Errorf("Due's record = %s, want the claimed record %s", describe(p.Record), describe(fresh(req)))
	case p.Mark.Route != want.Route || !bytes.Equal(p.Mark.Request, want.Request) || !p.Mark.After.Equal(want.After) || p.Mark.Tries != want.Tries:
		t.Errorf("Due's mark = {%q, %d bytes, %v, %d}, want the claim's {%q, %d bytes, %v, %d}",
			p.Mark.Route, len(p.Mark.Request), p.Mark.After, p.Mark.Tries, want.Route, len(want.Request), want.After, want.Tries)
	}
	// A duplicate that does not claim writes no mark: the holder's stays.
	dup := claimAt(id, 41, at(10*time.Second))
	dup.Mark = &store.Mark{Route: "refunds", After: at(20 * time.Second)}
	if res, err := s.Claim(ctx, dup); err != nil || res.Claimed {
		t.Fatalf("a duplicate's Claim under a live lease: claimed %v, %v; want not claimed", res.Claimed, err)
	}
	if _, ok := dueOf(t, s, id, at(30*time.Second)); ok {
		t.Errorf("a duplicate that did not claim wrote its mark (due at 20s) over the holder's")
	}
	if p, ok := dueOf(t, s, id, at(2*time.Minute)); !ok || p.Mark.Route != "payments" || p.Record.Token != 40 {
		t.Errorf("after a duplicate: Due = %+v (listed %v), want the holder's mark (payments, token 40)", p.Mark, ok)
	}
	// A takeover writes its mark under the new token, replacing the old.
	took := claimAt(id, 42, at(lease+time.Second))
	took.Takeover = true
	took.Mark = &store.Mark{Route: "payments", After: at(lease + 3*time.Minute)}
	mustClaim(t, ctx, s, took)
	if _, ok := dueOf(t, s, id, at(lease+2*time.Minute)); ok {
		t.Errorf("after a takeover: the old mark (due at 1m) is still due, want the takeover's (due at %v)", took.Mark.After)
	}
	if p, ok := dueOf(t, s, id, at(lease+3*time.Minute)); !ok || p.Record.Token != 42 || p.Mark.Tries != 0 || len(p.Mark.Request) != 0 {
		t.Errorf("after a takeover: Due = %+v (listed %v), want the takeover's mark under token 42", p, ok)
	}
	// An expired record replaced by a claim: the new claim's mark.
	exp := newID("SettleClaim", 1)
	old := claimAt(exp, 43, at(0))
	old.ExpiresAt = at(2 * time.Minute)
	old.Mark = &store.Mark{Route: "payments", After: at(time.Minute)}
	mustClaim(t, ctx, s, old)
	again := claimAt(exp, 44, at(3*time.Minute))
	again.Mark = &store.Mark{Route: "refunds", After: at(4 * time.Minute)}
	mustClaim(t, ctx, s, again)
	if p, ok := dueOf(t, s, exp, at(5*time.Minute)); !ok || p.Record.Token != 44 || p.Mark.Route != "refunds" {
		t.Errorf("after an expired record was claimed again: Due = %+v (listed %v), want the new claim's mark (refunds, token 44)", p, ok)
	}
	// A claim without a mark writes none.
	plainID := newID("SettleClaim", 2)
	mustClaim(t, ctx, s, claimAt(plainID, 45, at(0)))
	if _, ok := dueOf(t, s, plainID, at(time.Hour)); ok {
		t.Errorf("a claim without a mark: %s is due, want no mark", short(plainID))
	}
}

func testSettleAtomic(t *testing.T, s store.Settler, _ config) {
	ts, ok := s.(store.TxStore)
	if !ok {
		t.Skipf("%T does not implement store.TxStore: atomic mode does not apply", s)
	}
	for i, commit := range []bool{false, true, false, true} {
		byClaim := i >= 2 // the claim's mark (ClaimRequest.Mark), else a Mark call
		id := newID("SettleAtomic", i)
		tctx, tx, err := ts.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		req := claimAt(id, int64(30+i), at(0))
		req.LeaseUntil = time.Time{}
		m := markOf(at(time.Minute), 4)
		if byClaim {
			req.Mark = &m
		}
		mustClaim(t, tctx, ts, req)
		if !byClaim {
			wantOK(t, "Mark", s.Mark(tctx, id, req.Token, m))
		}
		wantOK(t, "Complete", ts.Complete(tctx, id, req.Token, store.Completion{State: store.StateIndeterminate, Status: 500, ExpiresAt: at(retention)}))
		if commit {
			wantOK(t, "Commit", tx.Commit())
		} else {
			wantOK(t, "Rollback", tx.Rollback())
		}
		got := mustDue(t, s, at(2*time.Minute), 10)
		switch {
		case commit && (len(got) != 1 || got[0].Record.ID != id):
			t.Errorf("Due after the commit (mark by the claim: %v): %v, want the committed mark", byClaim, dueIDs(got))
		case !commit && len(got) != 0:
			t.Errorf("Due after the rollback (mark by the claim: %v): %v, want none", byClaim, dueIDs(got))
		}
		if commit {
			wantOK(t, "Release", s.Release(t.Context(), id, req.Token))
		}
	}
	// A takeover in a transaction that rolls back leaves the record as it
	// was, and its mark with it: the lapsed lease is still the
	// completer's to settle.
	id := newID("SettleAtomic", 9)
	held := claimAt(id, 39, at(0))
	m := markOf(at(time.Minute), 4)
	held.Mark = &m
	mustClaim(t, t.Context(), ts, held)
	tctx, tx, err := ts.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	took := claimAt(id, 49, at(lease+time.Second))
	took.Takeover, took.LeaseUntil = true, time.Time{}
	took.Mark = &store.Mark{Route: "refunds", After: at(lease + 2*time.Second)}
	mustClaim(t, tctx, ts, took)
	wantOK(t, "Rollback", tx.Rollback())
	if p, ok := dueOf(t, s, id, at(lease+2*time.Minute)); !ok || p.Record.Token != 39 || p.Mark.Route != "payments" {
		t.Errorf("after a takeover rolled back: Due = %+v (listed %v), want the lapsed record's own mark (payments, token 39)", p, ok)
	}
	wantOK(t, "Release", s.Release(t.Context(), id, held.Token))
}
