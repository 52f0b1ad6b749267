package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// The cases of store.Inspector (an operator's listing). Each is listed,
// with its rule, in the cases table of storetest.go; they are skipped for
// stores that do not implement store.Inspector.

// inspectCase adapts a case of store.Inspector; it is skipped for stores
// that do not implement it.
func inspectCase(fn func(t *testing.T, s store.Inspector)) func(t *testing.T, s store.Store, cfg config) {
	return func(t *testing.T, s store.Store, _ config) {
		is, ok := s.(store.Inspector)
		if !ok {
			t.Skipf("%T does not implement store.Inspector: listing does not apply", s)
		}
		fn(t, is)
	}
}

// seedState creates a record of id, claimed at created by token, in state
// st: in progress (leased, as claimed), or completed or indeterminate
// with a response (which List must not return). It returns the record as
// Get reads it.
func seedState(t *testing.T, s store.Store, id store.ID, token int64, created time.Time, st store.State) store.Record {
	t.Helper()
	ctx := t.Context()
	req := claimAt(id, token, created)
	mustClaim(t, ctx, s, req)
	if st == store.StateInProgress {
		return fresh(req)
	}
	c := done(created.Add(time.Millisecond), 500, fmt.Sprintf(`{"token":%d}`, token))
	c.State = st
	if st == store.StateCompleted {
		c.Status = 201
	}
	wantOK(t, fmt.Sprintf("Complete(%s, %v)", short(id), st), s.Complete(ctx, id, token, c))
	return completed(fresh(req), c)
}

// listed is rec as List returns it: without its response.
func listed(rec store.Record) store.Record {
	rec.Response = nil
	return rec
}

// byAge sorts records as List orders them: CreatedAt, then ID bytewise.
func byAge(recs []store.Record) {
	slices.SortFunc(recs, func(a, b store.Record) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return bytes.Compare(a.ID[:], b.ID[:])
	})
}

// mustList runs q and fails t on an error.
func mustList(t *testing.T, s store.Inspector, q store.ListQuery) []store.Record {
	t.Helper()
	recs, err := s.List(t.Context(), q)
	if err != nil {
		t.Fatalf("List(state %v, limit %d, after %s): %v", q.State, q.Limit, q.After, err)
	}
	return recs
}

// checkListed fails t unless got holds the records of want, in order,
// without responses.
func checkListed(t *testing.T, what string, got, want []store.Record) {
	t.Helper()
	if len(got) != len(want) {
		ids := make([]string, len(got))
		for i, r := range got {
			ids[i] = short(r.ID) + " " + stamp(r.CreatedAt)
		}
		t.Errorf("%s: %d records %v, want %d", what, len(got), ids, len(want))
		return
	}
	for i := range want {
		checkRecord(t, fmt.Sprintf("%s, record %d", what, i), got[i], listed(want[i]))
	}
}

func testListOrder(t *testing.T, s store.Inspector) {
	// Seven indeterminate records, three created in the same instant (so
	// the ID decides), and records of the other states between them.
	created := []time.Duration{3 * time.Second, time.Second, 0, time.Second, 2 * time.Second, time.Second, 3 * time.Second}
	var want []store.Record
	for i, d := range created {
		want = append(want, seedState(t, s, newID("list-order", i), int64(101+i), at(d), store.StateIndeterminate))
	}
	seedState(t, s, newID("list-order-other", 0), 201, at(time.Second), store.StateCompleted)
	seedState(t, s, newID("list-order-other", 1), 202, at(time.Second), store.StateInProgress)
	byAge(want)
	now := at(time.Minute)

	all := mustList(t, s, store.ListQuery{State: store.StateIndeterminate, Now: now, Limit: store.MaxListLimit})
	checkListed(t, "List of every indeterminate record", all, want)

	// Pages of three: 3, 3, 1, each after the last record of the one before.
	var paged []store.Record
	after := store.Cursor{}
	for page := 0; page < 4; page++ {
		got := mustList(t, s, store.ListQuery{State: store.StateIndeterminate, Now: now, After: after, Limit: 3})
		if len(got) > 3 {
			t.Fatalf("page %d: %d records, limit 3", page, len(got))
		}
		paged = append(paged, got...)
		if len(got) < 3 {
			break
		}
		after = store.CursorOf(got[len(got)-1])
	}
	checkListed(t, "List in pages of 3", paged, want)

	// A page that ends exactly at the last record: the next one is empty.
	last := store.CursorOf(want[len(want)-1])
	if got := mustList(t, s, store.ListQuery{State: store.StateIndeterminate, Now: now, After: last, Limit: 3}); len(got) != 0 {
		t.Errorf("List after the last record: %d records, want none", len(got))
	}
	// The cursor of a record in a tie lists the rest of the tie.
	tie := slices.IndexFunc(want, func(r store.Record) bool { return r.CreatedAt.Equal(at(time.Second)) })
	got := mustList(t, s, store.ListQuery{State: store.StateIndeterminate, Now: now, After: store.CursorOf(want[tie]), Limit: store.MaxListLimit})
	checkListed(t, "List after the first record created at base+1s", got, want[tie+1:])
}

func testListFilters(t *testing.T, s store.Inspector) {
	ctx := t.Context()
	inProgress := seedState(t, s, newID("list-filter", 0), 101, at(0), store.StateInProgress)
	done := seedState(t, s, newID("list-filter", 1), 102, at(time.Second), store.StateCompleted)
	old := seedState(t, s, newID("list-filter", 2), 103, at(2*time.Second), store.StateIndeterminate)
	young := seedState(t, s, newID("list-filter", 4), 105, at(5*time.Second), store.StateIndeterminate)
	// An indeterminate record that expires at the listing's now.
	expiring := claimAt(newID("list-filter", 3), 104, at(3*time.Second))
	mustClaim(t, ctx, s, expiring)
	wantOK(t, "Complete(expiring)", s.Complete(ctx, expiring.ID, 104, store.Completion{
		State: store.StateIndeterminate, Status: 500, Response: []byte("x"), ExpiresAt: at(time.Hour),
	}))
	now := at(time.Hour)

	list := func(st store.State, before time.Time) []store.Record {
		return mustList(t, s, store.ListQuery{State: st, Now: now, CreatedBefore: before, Limit: 10})
	}
	checkListed(t, "List(indeterminate)", list(store.StateIndeterminate, time.Time{}), []store.Record{old, young})
	checkListed(t, "List(indeterminate, created before base+5s)", list(store.StateIndeterminate, at(5*time.Second)), []store.Record{old})
	checkListed(t, "List(in_progress)", list(store.StateInProgress, time.Time{}), []store.Record{inProgress})
	checkListed(t, "List(in_progress, created before base+0s)", list(store.StateInProgress, at(0)), nil)
	checkListed(t, "List(completed)", list(store.StateCompleted, time.Time{}), []store.Record{done})
	// Released: gone from the list.
	wantOK(t, "Release(in progress)", s.Release(ctx, inProgress.ID, 101))
	checkListed(t, "List(in_progress) after Release", list(store.StateInProgress, time.Time{}), nil)
}

func testListInvalid(t *testing.T, s store.Inspector) {
	seedState(t, s, newID("list-invalid", 0), 101, at(0), store.StateIndeterminate)
	for _, q := range []store.ListQuery{
		{State: 0, Now: at(time.Minute), Limit: 10},
		{State: 4, Now: at(time.Minute), Limit: 10},
		{State: store.StateIndeterminate, Now: at(time.Minute), Limit: 0},
		{State: store.StateIndeterminate, Now: at(time.Minute), Limit: -1},
		{State: store.StateIndeterminate, Now: at(time.Minute), Limit: store.MaxListLimit + 1},
	} {
		recs, err := s.List(t.Context(), q)
		if !errors.Is(err, core.ErrConfig) {
			t.Errorf("List(state %d, limit %d) = (%d records, %v), want an error wrapping ErrConfig", q.State, q.Limit, len(recs), err)
		}
	}
}
