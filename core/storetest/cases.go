package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// The cases of leased mode (any store). Each is listed, with its rule, in
// the cases table of storetest.go.

func testClaimAbsent(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("absent", 0)
	req := claimAt(id, 101, at(0))
	want := fresh(req)
	checkRecord(t, "Claim result", mustClaim(t, ctx, s, req), want)
	checkRecord(t, "Get after Claim", mustGet(t, ctx, s, id, at(time.Second)), want)
	wantAbsent(t, ctx, s, newID("absent", 1), at(0))
}

func testClaimExisting(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("existing", 0)
	first := claimAt(id, 101, at(0))
	want := fresh(first)
	mustClaim(t, ctx, s, first)

	other := claimAt(id, 102, at(time.Second))
	other.Fingerprint = fingerprint(2)
	noFingerprint := claimAt(id, 103, at(2*time.Second))
	noFingerprint.Fingerprint = nil
	liveLease := claimAt(id, 104, at(lease-time.Millisecond))
	liveLease.Takeover = true
	for _, req := range []store.ClaimRequest{other, noFingerprint, liveLease} {
		got := mustNotClaim(t, ctx, s, req)
		checkRecord(t, fmt.Sprintf("Claim result for token %d", req.Token), got, want)
	}
	checkRecord(t, "Get after the refused claims", mustGet(t, ctx, s, id, at(time.Minute)), want)
}

func testIndependentIDs(t *testing.T, s store.Store) {
	ctx := t.Context()
	// IDs that differ only in their last or their first byte.
	a := newID("independent", 0)
	b, c := a, a
	b[len(b)-1] ^= 1
	c[0] ^= 1
	ra, rb, rc := claimAt(a, 101, at(0)), claimAt(b, 102, at(0)), claimAt(c, 103, at(0))
	rb.Fingerprint = fingerprint(2)
	rc.Fingerprint = fingerprint(3)
	mustClaim(t, ctx, s, ra)
	mustClaim(t, ctx, s, rb)
	mustClaim(t, ctx, s, rc)

	comp := done(at(time.Second), 201, `{"id":"or_a"}`)
	wantOK(t, "Complete(a)", s.Complete(ctx, a, 101, comp))
	wantOK(t, "Release(c)", s.Release(ctx, c, 103))
	checkRecord(t, "Get(a)", mustGet(t, ctx, s, a, at(time.Minute)), completed(fresh(ra), comp))
	checkRecord(t, "Get(b)", mustGet(t, ctx, s, b, at(time.Minute)), fresh(rb))
	wantAbsent(t, ctx, s, c, at(time.Minute))
	wantFenced(t, "Complete(b) with the token of a", s.Complete(ctx, b, 101, comp))
}

const racers = 32

// raceToken returns the distinct tokens of the racers of round n.
func raceToken(n, i int) int64 { return int64(1000*(n+1) + i + 1) }

// checkRace fails t unless exactly one of results claimed and every other
// returned the winner's record (in progress, the winner's token). It
// returns the winner's index, or -1.
func checkRace(t *testing.T, cfg config, id store.ID, results []store.ClaimResult, errs []error) int {
	t.Helper()
	winner := -1
	for i, res := range results {
		if cfg.lostOK(errs[i]) {
			continue
		}
		if errs[i] != nil {
			t.Errorf("Claim(%s) by racer %d: %v", short(id), i, errs[i])
			continue
		}
		if res.Claimed {
			if winner >= 0 {
				t.Errorf("Claim(%s): racers %d and %d both claimed", short(id), winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Errorf("Claim(%s): none of %d racers claimed", short(id), len(results))
		return -1
	}
	wantToken := results[winner].Record.Token
	for i, res := range results {
		if errs[i] != nil || res.Claimed {
			continue
		}
		if res.Record.State != store.StateInProgress || res.Record.Token != wantToken {
			t.Errorf("Claim(%s) by racer %d: existing record %s, want the winner's (in_progress, token %d)",
				short(id), i, describe(res.Record), wantToken)
		}
	}
	return winner
}

// claimRace races claims of reqs[i] and checks them with checkRace.
func claimRace(t *testing.T, s store.Store, cfg config, reqs []store.ClaimRequest) int {
	t.Helper()
	ctx := t.Context()
	results := make([]store.ClaimResult, len(reqs))
	errs := make([]error, len(reqs))
	store := cfg.racer(t, s)
	race(len(reqs), func(i int) { results[i], errs[i] = store(i).Claim(ctx, reqs[i]) })
	return checkRace(t, cfg, reqs[0].ID, results, errs)
}

func testClaimRace(t *testing.T, s store.Store, cfg config) {
	ctx := t.Context()
	for n := range 4 {
		id := newID("race", n)
		reqs := make([]store.ClaimRequest, racers)
		for i := range reqs {
			reqs[i] = claimAt(id, raceToken(n, i), at(0))
		}
		w := claimRace(t, s, cfg, reqs)
		if w < 0 {
			continue
		}
		checkRecord(t, fmt.Sprintf("Get after race %d", n), mustGet(t, ctx, s, id, at(time.Second)), fresh(reqs[w]))
	}
}

func testClaimRaceExpired(t *testing.T, s store.Store, cfg config) {
	ctx := t.Context()
	for n := range 4 {
		id := newID("race-expired", n)
		old := claimAt(id, 1, at(0))
		old.ExpiresAt = at(time.Hour)
		mustClaim(t, ctx, s, old)
		if n%2 == 1 {
			wantOK(t, "Complete", s.Complete(ctx, id, 1, store.Completion{
				State: store.StateCompleted, Status: 200, Response: []byte("old"), ExpiresAt: at(time.Hour),
			}))
		}
		reqs := make([]store.ClaimRequest, racers)
		for i := range reqs {
			reqs[i] = claimAt(id, raceToken(n, i), at(2*time.Hour))
			reqs[i].Takeover = true
		}
		w := claimRace(t, s, cfg, reqs)
		if w < 0 {
			continue
		}
		checkRecord(t, fmt.Sprintf("Get after race %d", n), mustGet(t, ctx, s, id, at(2*time.Hour)), fresh(reqs[w]))
	}
}

// takenOver returns old after a takeover by req.
func takenOver(old store.Record, req store.ClaimRequest) store.Record {
	r := old
	r.Fingerprint = req.Fingerprint
	r.Token = req.Token
	r.Attempt++
	r.LeaseUntil = req.LeaseUntil
	r.ExpiresAt = req.ExpiresAt
	return r
}

func testClaimRaceTakeover(t *testing.T, s store.Store, cfg config) {
	ctx := t.Context()
	for n := range 4 {
		id := newID("race-takeover", n)
		first := claimAt(id, 1, at(0))
		mustClaim(t, ctx, s, first)
		reqs := make([]store.ClaimRequest, racers)
		for i := range reqs {
			reqs[i] = claimAt(id, raceToken(n, i), at(lease+time.Second))
			reqs[i].Takeover = true
		}
		w := claimRace(t, s, cfg, reqs)
		if w < 0 {
			continue
		}
		want := takenOver(fresh(first), reqs[w])
		checkRecord(t, fmt.Sprintf("Get after race %d", n), mustGet(t, ctx, s, id, at(lease+time.Second)), want)
	}
}

func testFencing(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("fencing", 0)
	const holder = math.MaxInt64
	req := claimAt(id, holder, at(0))
	want := fresh(req)
	mustClaim(t, ctx, s, req)

	for _, stale := range []int64{holder - 1, -holder, math.MinInt64, -1, 1} {
		op := fmt.Sprintf(" with token %d instead of %d", stale, int64(holder))
		wantFenced(t, "Complete"+op, s.Complete(ctx, id, stale, done(at(time.Second), 201, "x")))
		wantFenced(t, "Extend"+op, s.Extend(ctx, id, stale, at(time.Minute)))
		wantFenced(t, "Release"+op, s.Release(ctx, id, stale))
	}
	checkRecord(t, "Get after the stale calls", mustGet(t, ctx, s, id, at(time.Second)), want)

	wantOK(t, "Extend with the holder's token", s.Extend(ctx, id, holder, at(time.Minute)))
	want.LeaseUntil = at(time.Minute)
	checkRecord(t, "Get after Extend", mustGet(t, ctx, s, id, at(2*time.Second)), want)

	comp := done(at(3*time.Second), 201, `{"id":"or_1"}`)
	wantOK(t, "Complete with the holder's token", s.Complete(ctx, id, holder, comp))
	checkRecord(t, "Get after Complete", mustGet(t, ctx, s, id, at(4*time.Second)), completed(want, comp))
}

func testTakeover(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("takeover", 0)
	first := claimAt(id, 101, at(0))
	mustClaim(t, ctx, s, first)

	// LeaseUntil == Now: the lease has lapsed.
	second := claimAt(id, 102, at(lease))
	second.Fingerprint = fingerprint(2)
	second.Takeover = true
	want := takenOver(fresh(first), second)
	checkRecord(t, "Claim result of the takeover", mustClaim(t, ctx, s, second), want)
	checkRecord(t, "Get after the takeover", mustGet(t, ctx, s, id, at(lease)), want)

	wantFenced(t, "Complete with the token taken over", s.Complete(ctx, id, 101, done(at(lease), 201, "late")))
	wantFenced(t, "Extend with the token taken over", s.Extend(ctx, id, 101, at(time.Hour)))
	wantFenced(t, "Release with the token taken over", s.Release(ctx, id, 101))
	checkRecord(t, "Get after the old token's calls", mustGet(t, ctx, s, id, at(lease)), want)

	// A second takeover counts on, and takes the request's fingerprint even
	// when it has none.
	third := claimAt(id, 103, at(3*lease))
	third.Fingerprint = nil
	third.Takeover = true
	want = takenOver(want, third)
	checkRecord(t, "Claim result of the second takeover", mustClaim(t, ctx, s, third), want)
	wantFenced(t, "Extend with the token of the first takeover", s.Extend(ctx, id, 102, at(time.Hour)))

	wantOK(t, "Extend with the new token", s.Extend(ctx, id, 103, at(4*lease)))
	want.LeaseUntil = at(4 * lease)
	comp := done(at(4*lease), 201, `{"id":"or_1"}`)
	wantOK(t, "Complete with the new token", s.Complete(ctx, id, 103, comp))
	checkRecord(t, "Get after Complete", mustGet(t, ctx, s, id, at(4*lease)), completed(want, comp))
}

func testTakeoverNotRequested(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("no-takeover", 0)
	first := claimAt(id, 101, at(0))
	want := fresh(first)
	mustClaim(t, ctx, s, first)

	second := claimAt(id, 102, at(time.Minute))
	second.Fingerprint = fingerprint(2)
	checkRecord(t, "Claim result without Takeover", mustNotClaim(t, ctx, s, second), want)
	checkRecord(t, "Get after the claim", mustGet(t, ctx, s, id, at(time.Minute)), want)
	wantOK(t, "Complete with the lapsed holder's token", s.Complete(ctx, id, 101, done(at(time.Minute), 200, "")))
}

func testLiveLeaseKept(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("live-lease", 0)
	first := claimAt(id, 101, at(0))
	want := fresh(first)
	mustClaim(t, ctx, s, first)
	early := claimAt(id, 102, at(lease-time.Millisecond))
	early.Takeover = true
	checkRecord(t, "Claim result 1 ms before the lease lapses", mustNotClaim(t, ctx, s, early), want)
	checkRecord(t, "Get", mustGet(t, ctx, s, id, at(lease)), want)

	zero := newID("live-lease", 1)
	atomicReq := claimAt(zero, 201, at(0))
	atomicReq.LeaseUntil = time.Time{}
	zwant := fresh(atomicReq)
	checkRecord(t, "Claim result with a zero lease", mustClaim(t, ctx, s, atomicReq), zwant)
	late := claimAt(zero, 202, at(time.Hour))
	late.Takeover = true
	checkRecord(t, "Claim result of a takeover of a zero lease", mustNotClaim(t, ctx, s, late), zwant)
	checkRecord(t, "Get of the zero lease", mustGet(t, ctx, s, zero, at(time.Hour)), zwant)
}

func testExtend(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("extend", 0)
	req := claimAt(id, 101, at(0))
	req.ExpiresAt = at(time.Minute) // shorter than the extended lease
	want := fresh(req)
	mustClaim(t, ctx, s, req)

	extend := func(until, minExpiry time.Time) {
		t.Helper()
		wantOK(t, "Extend to "+stamp(until), s.Extend(ctx, id, 101, until))
		got := mustGet(t, ctx, s, id, at(90*time.Second))
		if got.ExpiresAt.Before(minExpiry) {
			t.Errorf("Extend to %s: ExpiresAt = %s, want at least %s", stamp(until), stamp(got.ExpiresAt), stamp(minExpiry))
		}
		want.LeaseUntil = until
		want.ExpiresAt = got.ExpiresAt
		checkRecord(t, "Get after Extend to "+stamp(until), got, want)
	}
	extend(at(2*time.Minute), at(2*time.Minute)) // raises ExpiresAt
	extend(at(100*time.Second), want.ExpiresAt)  // never lowers it

	// The extended lease protects the attempt past its first lease.
	tk := claimAt(id, 102, at(90*time.Second))
	tk.Takeover = true
	checkRecord(t, "Claim result of a takeover before the extended lease lapses", mustNotClaim(t, ctx, s, tk), want)

	// Only an in-progress record can be extended.
	ind := store.Completion{State: store.StateIndeterminate, Status: 504, Response: []byte("timeout"), ExpiresAt: at(retention)}
	wantOK(t, "Complete as indeterminate", s.Complete(ctx, id, 101, ind))
	wantFenced(t, "Extend of an indeterminate record", s.Extend(ctx, id, 101, at(time.Hour)))
	wantOK(t, "Complete", s.Complete(ctx, id, 101, done(at(time.Hour), 200, "ok")))
	wantFenced(t, "Extend of a completed record", s.Extend(ctx, id, 101, at(2*time.Hour)))
}

func testExpiredIsAbsent(t *testing.T, s store.Store) {
	ctx := t.Context()
	exp := at(time.Hour)
	for i, state := range []store.State{store.StateInProgress, store.StateCompleted, store.StateIndeterminate} {
		id := newID("expired", i)
		req := claimAt(id, int64(101+i), at(0))
		req.ExpiresAt = exp
		mustClaim(t, ctx, s, req)
		if state != store.StateInProgress {
			wantOK(t, "Complete", s.Complete(ctx, id, req.Token, store.Completion{
				State: state, Status: 500 + i, Response: []byte("body"), ExpiresAt: exp,
			}))
		}
		if r := mustGet(t, ctx, s, id, exp.Add(-time.Millisecond)); r.State != state {
			t.Errorf("Get 1 ms before expiry: State = %v, want %v", r.State, state)
		}
		wantAbsent(t, ctx, s, id, exp)
		wantAbsent(t, ctx, s, id, exp.Add(retention))
	}
}

func testClaimExpired(t *testing.T, s store.Store) {
	ctx := t.Context()
	exp := at(time.Hour)
	for i, state := range []store.State{store.StateInProgress, store.StateCompleted, store.StateIndeterminate} {
		id := newID("claim-expired", i)
		old := claimAt(id, int64(101+i), at(0))
		old.ExpiresAt = exp
		mustClaim(t, ctx, s, old)
		if state != store.StateInProgress {
			wantOK(t, "Complete", s.Complete(ctx, id, old.Token, store.Completion{
				State: state, Status: 200, Response: []byte("old response"), ExpiresAt: exp,
			}))
		}
		// At the instant of expiry; Takeover is set to check that replacing
		// an expired record is not a takeover (Attempt stays 1).
		req := claimAt(id, int64(201+i), exp)
		req.Takeover = true
		if i == 0 {
			req.Fingerprint = nil
		} else {
			req.Fingerprint = fingerprint(2)
		}
		want := fresh(req)
		what := fmt.Sprintf("claim of an expired %v record", state)
		checkRecord(t, "Claim result of a "+what, mustClaim(t, ctx, s, req), want)
		checkRecord(t, "Get after a "+what, mustGet(t, ctx, s, id, exp), want)
		wantFenced(t, "Complete with the expired record's token", s.Complete(ctx, id, old.Token, done(exp, 200, "")))
		wantFenced(t, "Extend with the expired record's token", s.Extend(ctx, id, old.Token, exp.Add(lease)))
		wantFenced(t, "Release with the expired record's token", s.Release(ctx, id, old.Token))
		checkRecord(t, "Get after the old token's calls", mustGet(t, ctx, s, id, exp), want)
	}
}

func testDeletedRecord(t *testing.T, s store.Store) {
	ctx := t.Context()
	check := func(what string, id store.ID, token int64) {
		t.Helper()
		wantFenced(t, "Complete of "+what, s.Complete(ctx, id, token, done(at(2*time.Hour), 200, "")))
		wantFenced(t, "Extend of "+what, s.Extend(ctx, id, token, at(3*time.Hour)))
		wantOK(t, "Release of "+what, s.Release(ctx, id, token))
		wantAbsent(t, ctx, s, id, at(0))
	}

	swept := newID("deleted", 0)
	req := claimAt(swept, 101, at(0))
	req.ExpiresAt = at(time.Hour)
	mustClaim(t, ctx, s, req)
	n, err := s.DeleteExpired(ctx, at(time.Hour), 10)
	wantOK(t, "DeleteExpired", err)
	if n != 1 {
		t.Fatalf("DeleteExpired = %d, want 1", n)
	}
	check("a swept record", swept, 101)

	released := newID("deleted", 1)
	mustClaim(t, ctx, s, claimAt(released, 102, at(0)))
	wantOK(t, "Release", s.Release(ctx, released, 102))
	check("a released record", released, 102)

	check("a record that never existed", newID("deleted", 2), 103)
}

func testFingerprint(t *testing.T, s store.Store) {
	ctx := t.Context()
	zeros := fingerprint(3)
	zeros[0], zeros[15], zeros[30], zeros[31] = 0, 0, 0, 0 // NUL bytes, trailing too
	ones := bytes.Repeat([]byte{0xff}, 32)
	long := append(fingerprint(4), fingerprint(5)...) // 64 bytes, e.g. SHA-512
	for i, fp := range [][]byte{nil, {}, fingerprint(2), zeros, ones, {0x00}, long} {
		id := newID("fingerprint", i)
		req := claimAt(id, int64(101+i), at(0))
		req.Fingerprint = fp
		want := fresh(req)
		what := fmt.Sprintf("fingerprint %d (%d bytes)", i, len(fp))
		checkRecord(t, "Claim result with "+what, mustClaim(t, ctx, s, req), want)
		checkRecord(t, "Get with "+what, mustGet(t, ctx, s, id, at(0)), want)
	}
}

func testResponseBytes(t *testing.T, s store.Store) {
	ctx := t.Context()
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	random := make([]byte, 1<<20)
	_, _ = rand.NewChaCha8([32]byte{'i', 'd', 'e', 'm'}).Read(random)
	for i, c := range []struct {
		name   string
		state  store.State
		status int
		body   []byte
	}{
		{"every byte value", store.StateCompleted, 200, every},
		{"1 MiB of random bytes", store.StateCompleted, 201, random},
		{"trailing NUL and spaces", store.StateCompleted, 202, []byte("x \x00 \x00")},
		{"invalid UTF-8", store.StateCompleted, 422, []byte("\xff\xfe\xc3(")},
		{"empty body", store.StateCompleted, 204, []byte{}},
		{"nil body", store.StateCompleted, 304, nil},
		{"indeterminate 502", store.StateIndeterminate, 502, []byte(`{"type":"about:blank"}`)},
	} {
		id := newID("response", i)
		req := claimAt(id, int64(101+i), at(0))
		mustClaim(t, ctx, s, req)
		comp := store.Completion{State: c.state, Status: c.status, Response: c.body, ExpiresAt: at(retention + time.Duration(i)*time.Millisecond)}
		wantOK(t, "Complete with "+c.name, s.Complete(ctx, id, req.Token, comp))
		checkRecord(t, "Get of a response with "+c.name, mustGet(t, ctx, s, id, at(time.Second)), completed(fresh(req), comp))
	}
}

// scribble overwrites b, to prove that a store does not share it.
func scribble(b []byte) {
	for i := range b {
		b[i] ^= 0xa5
	}
}

func testNoAliasing(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("aliasing", 0)
	req := claimAt(id, 101, at(0))
	want := fresh(req)
	want.Fingerprint = bytes.Clone(req.Fingerprint)

	scribble(mustClaim(t, ctx, s, req).Fingerprint)
	scribble(req.Fingerprint)
	scribble(mustNotClaim(t, ctx, s, claimAt(id, 102, at(0))).Fingerprint)
	got := mustGet(t, ctx, s, id, at(0))
	checkRecord(t, "Get after changing the slices of Claim", got, want)
	scribble(got.Fingerprint)

	body := []byte(`{"id":"or_1","amount":1000}`)
	comp := done(at(time.Second), 201, "")
	comp.Response = body
	want = completed(want, comp)
	want.Response = bytes.Clone(body)
	wantOK(t, "Complete", s.Complete(ctx, id, 101, comp))
	scribble(body)
	got = mustGet(t, ctx, s, id, at(time.Second))
	checkRecord(t, "Get after changing the slice given to Complete", got, want)
	scribble(got.Response)
	scribble(got.Fingerprint)
	checkRecord(t, "Get after changing the slices Get returned", mustGet(t, ctx, s, id, at(time.Second)), want)
}

func testIndeterminate(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("indeterminate", 0)
	req := claimAt(id, 101, at(0))
	mustClaim(t, ctx, s, req)
	ind := store.Completion{
		State: store.StateIndeterminate, Status: 502,
		Response: []byte(`{"error":"upstream timeout"}`), ExpiresAt: at(retention),
	}
	wantOK(t, "Complete as indeterminate", s.Complete(ctx, id, 101, ind))
	want := completed(fresh(req), ind)
	checkRecord(t, "Get of the indeterminate record", mustGet(t, ctx, s, id, at(time.Minute)), want)

	tk := claimAt(id, 102, at(time.Hour))
	tk.Takeover = true
	checkRecord(t, "Claim result with Takeover", mustNotClaim(t, ctx, s, tk), want)
	wantFenced(t, "Extend of the indeterminate record", s.Extend(ctx, id, 101, at(2*time.Hour)))
	wantFenced(t, "Complete with another token", s.Complete(ctx, id, 102, done(at(time.Hour), 201, "")))
	wantFenced(t, "Release with another token", s.Release(ctx, id, 102))
	checkRecord(t, "Get after the refused calls", mustGet(t, ctx, s, id, at(time.Hour)), want)

	settled := done(at(2*time.Hour), 201, `{"id":"or_1"}`)
	wantOK(t, "Complete settling the indeterminate record", s.Complete(ctx, id, 101, settled))
	checkRecord(t, "Get after settling", mustGet(t, ctx, s, id, at(2*time.Hour)), completed(want, settled))

	// The other way to settle: release, so the next request runs.
	rel := newID("indeterminate", 1)
	mustClaim(t, ctx, s, claimAt(rel, 201, at(0)))
	wantOK(t, "Complete as indeterminate", s.Complete(ctx, rel, 201, ind))
	wantOK(t, "Release of the indeterminate record", s.Release(ctx, rel, 201))
	wantAbsent(t, ctx, s, rel, at(time.Minute))
	again := claimAt(rel, 202, at(time.Minute))
	checkRecord(t, "Claim result after Release", mustClaim(t, ctx, s, again), fresh(again))
}

func testCompletedIsFinal(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("completed", 0)
	req := claimAt(id, 101, at(0))
	mustClaim(t, ctx, s, req)
	comp := done(at(time.Second), 201, `{"id":"or_1"}`)
	wantOK(t, "Complete", s.Complete(ctx, id, 101, comp))
	want := completed(fresh(req), comp)

	wantFenced(t, "Release of a completed record", s.Release(ctx, id, 101))
	wantFenced(t, "Complete of a completed record", s.Complete(ctx, id, 101, done(at(2*time.Second), 500, "again")))
	wantFenced(t, "Complete of a completed record as indeterminate", s.Complete(ctx, id, 101, store.Completion{
		State: store.StateIndeterminate, Status: 502, ExpiresAt: at(retention),
	}))
	wantFenced(t, "Extend of a completed record", s.Extend(ctx, id, 101, at(time.Hour)))
	tk := claimAt(id, 102, at(time.Hour))
	tk.Takeover = true
	checkRecord(t, "Claim result for the completed record", mustNotClaim(t, ctx, s, tk), want)
	checkRecord(t, "Get after the refused calls", mustGet(t, ctx, s, id, at(time.Hour)), want)
}

func testRelease(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := newID("release", 0)
	mustClaim(t, ctx, s, claimAt(id, 101, at(0)))
	wantOK(t, "Release", s.Release(ctx, id, 101))
	wantAbsent(t, ctx, s, id, at(time.Second))
	wantOK(t, "Release of a released record", s.Release(ctx, id, 101))

	again := claimAt(id, 102, at(2*time.Second))
	again.Fingerprint = fingerprint(2)
	checkRecord(t, "Claim result after Release", mustClaim(t, ctx, s, again), fresh(again))
	wantOK(t, "Release of a record that never existed", s.Release(ctx, newID("release", 1), 103))
}

func testDebugFields(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i, f := range []struct{ caller, scope, key string }{
		{ // MaxDebugLen bytes of 2-, 3- and 4-byte runes.
			strings.Repeat("é", store.MaxDebugLen/2) + "a",
			strings.Repeat("€", store.MaxDebugLen/3),
			strings.Repeat("😀", store.MaxDebugLen/4) + "abc",
		},
		{"it's \"quoted\" \\ %_ ;--", "PATCH /v1/a/{id}\t/b", "🔑 key"},
		{"", "", ""},
	} {
		if i == 0 {
			for _, s := range []string{f.caller, f.scope, f.key} {
				if len(s) != store.MaxDebugLen {
					panic(fmt.Sprintf("storetest: debug field of %d bytes, want %d", len(s), store.MaxDebugLen))
				}
			}
		}
		id := newID("debug", i)
		req := claimAt(id, int64(101+i), at(0))
		req.Caller, req.Scope, req.Key = f.caller, f.scope, f.key
		want := fresh(req)
		checkRecord(t, fmt.Sprintf("Claim result %d", i), mustClaim(t, ctx, s, req), want)
		checkRecord(t, fmt.Sprintf("Get %d", i), mustGet(t, ctx, s, id, at(0)), want)
	}
}

// seedExpiring claims expired records "name" 0..expired-1, whose ExpiresAt
// is at most now (some exactly now), and live records "name-live"
// 0..live-1, whose ExpiresAt is after now (some 1 ms after). It completes
// some of each, so that every state is represented.
func seedExpiring(t *testing.T, s store.Store, name string, now time.Time, expired, live int) (expiredIDs, liveIDs []store.ID) {
	t.Helper()
	ctx := t.Context()
	seed := func(id store.ID, i int, expires time.Time) {
		req := claimAt(id, int64(i+1), at(0))
		req.ExpiresAt = expires
		mustClaim(t, ctx, s, req)
		if i%3 != 0 {
			state := store.StateCompleted
			if i%3 == 2 {
				state = store.StateIndeterminate
			}
			wantOK(t, "Complete", s.Complete(ctx, id, req.Token, store.Completion{
				State: state, Status: 200, Response: []byte("body"), ExpiresAt: expires,
			}))
		}
	}
	for i := range expired {
		id := newID(name, i)
		expires := now.Add(-time.Duration(i) * time.Millisecond) // i == 0: exactly now
		seed(id, i, expires)
		expiredIDs = append(expiredIDs, id)
	}
	for i := range live {
		id := newID(name+"-live", i)
		expires := now.Add(time.Duration(1+i*1000) * time.Millisecond) // i == 0: 1 ms after now
		seed(id, i, expires)
		liveIDs = append(liveIDs, id)
	}
	return expiredIDs, liveIDs
}

// checkSwept fails t unless every expired record is deleted and every live
// one kept. Get at the base time (before any expiry) tells them apart.
func checkSwept(t *testing.T, s store.Store, expired, live []store.ID) {
	t.Helper()
	ctx := t.Context()
	for i, id := range expired {
		if r, err := s.Get(ctx, id, at(0)); !errors.Is(err, core.ErrNotFound) {
			t.Errorf("expired record %d (%s): Get before its expiry = (%s, %v), want ErrNotFound: not deleted",
				i, short(id), describe(r), err)
		}
	}
	for i, id := range live {
		if _, err := s.Get(ctx, id, at(0)); err != nil {
			t.Errorf("live record %d (%s): Get: %v: deleted or damaged", i, short(id), err)
		}
	}
}

func testDeleteExpiredBatches(t *testing.T, s store.Store) {
	ctx := t.Context()
	now := at(2 * time.Hour)
	expired, live := seedExpiring(t, s, "sweep", now, 250, 50)
	for call, want := range []int{100, 100, 50, 0} {
		n, err := s.DeleteExpired(ctx, now, 100)
		if err != nil {
			t.Fatalf("DeleteExpired call %d: %v", call+1, err)
		}
		if n != want {
			t.Errorf("DeleteExpired call %d with limit 100 over 250 expired records = %d, want %d", call+1, n, want)
		}
	}
	checkSwept(t, s, expired, live)
}

func testDeleteExpiredConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	now := at(2 * time.Hour)
	const sweepers, limit, total = 4, 7, 200
	expired, live := seedExpiring(t, s, "concurrent-sweep", now, total, 20)
	counts := make([]int, sweepers)
	errs := make([]error, sweepers)
	race(sweepers, func(g int) {
		for range total + 1 { // bounded, in case a store never reports 0
			n, err := s.DeleteExpired(ctx, now, limit)
			if err != nil {
				errs[g] = err
				return
			}
			if n > limit {
				errs[g] = fmt.Errorf("DeleteExpired deleted %d records, more than its limit %d", n, limit)
				return
			}
			counts[g] += n
			if n == 0 {
				return
			}
		}
	})
	sum := 0
	for g := range sweepers {
		if errs[g] != nil {
			t.Errorf("sweeper %d: %v", g, errs[g])
		}
		sum += counts[g]
	}
	if sum != total {
		t.Errorf("%d concurrent sweepers deleted %v = %d records in all, want %d", sweepers, counts, sum, total)
	}
	n, err := s.DeleteExpired(ctx, now, limit)
	if err != nil || n != 0 {
		t.Errorf("DeleteExpired after the sweepers = (%d, %v), want (0, nil)", n, err)
	}
	checkSwept(t, s, expired, live)
}

func testCancelledContext(t *testing.T, s store.Store) {
	live := t.Context()
	held := newID("cancelled", 0)
	heldReq := claimAt(held, 101, at(0))
	mustClaim(t, live, s, heldReq)
	absent := newID("cancelled", 1)

	ctx, cancel := context.WithCancel(live)
	cancel()
	check := func(op string, err error) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s with a cancelled context: no error, want one", op)
		case errors.Is(err, core.ErrNotFound), errors.Is(err, core.ErrFenced):
			t.Errorf("%s with a cancelled context: %v, want an error that is neither ErrNotFound nor ErrFenced", op, err)
		}
	}
	_, err := s.Claim(ctx, claimAt(absent, 201, at(0)))
	check("Claim", err)
	check("Extend", s.Extend(ctx, held, 101, at(time.Minute)))
	check("Complete", s.Complete(ctx, held, 101, done(at(time.Second), 201, "x")))
	check("Release", s.Release(ctx, held, 101))
	check("Release of an absent record", s.Release(ctx, absent, 201))
	_, err = s.Get(ctx, held, at(0))
	check("Get", err)
	_, err = s.Get(ctx, absent, at(0))
	check("Get of an absent record", err)
	_, err = s.DeleteExpired(ctx, at(2*retention), 10)
	check("DeleteExpired", err)

	wantAbsent(t, live, s, absent, at(0))
	checkRecord(t, "Get after the cancelled calls", mustGet(t, live, s, held, at(0)), fresh(heldReq))
}
