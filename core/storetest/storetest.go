package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// Run runs every conformance case as a subtest of t, each with a fresh
// store from newStore. newStore must return an empty store; it may register
// its own cleanup with t.Cleanup. opts declare what the store documents
// about itself (SerialWriters).
func Run(t *testing.T, newStore func(t *testing.T) store.Store, opts ...Option) {
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("rule: %s", c.rule)
					if cfg.serialWriters {
						t.Logf("(run with SerialWriters: %s)", serialRule)
					}
					if cfg.peers != nil {
						t.Logf("(run with Peers: %s)", peersRule)
					}
				}
			})
			s := newStore(t)
			if s == nil {
				t.Fatal("newStore returned a nil store")
			}
			c.fn(t, s, cfg)
		})
	}
}

// Option declares a documented property of the store under test that
// changes what some cases check. See SerialWriters.
type Option interface{ apply(*config) }

type config struct {
	serialWriters bool
	peers         func(t *testing.T, s store.Store) []store.Store
}

// racer returns, for the race cases, the store racer i uses: s, or under
// Peers s and its peers in turn.
func (c config) racer(t *testing.T, s store.Store) func(i int) store.Store {
	if c.peers == nil {
		return func(int) store.Store { return s }
	}
	all := append([]store.Store{s}, c.peers(t, s)...)
	return func(i int) store.Store { return all[i%len(all)] }
}

// lostOK reports whether a racer may fail with core.ErrLostRace (Peers).
func (c config) lostOK(err error) bool {
	return c.peers != nil && errors.Is(err, core.ErrLostRace)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// serialRule is what SerialWriters relaxes, printed with a failing case's
// rule.
const serialRule = "a claim of another identity may wait for the open transaction to end; " +
	"a duplicate claim may answer in progress at once, or wait and then answer from the outcome: " +
	"the committed record, or a new claim after a rollback"

// SerialWriters declares a store on a database that admits one writer at
// a time (SQLite), as store.Store's documentation allows: while a
// transaction holds a claim, a claim of another identity may wait for that
// transaction to end, and a duplicate claim of the held identity may,
// instead of answering in progress at once, wait for it to end and then
// answer from its outcome (the committed record, or a new claim after a
// rollback). The atomic-mode cases then run each such claim beside the open
// transaction, end the transaction, and check whichever answer came:
// never a second claim of a committed identity, never a response that was
// not committed. Every other rule stays as it is.
func SerialWriters() Option { return optionFunc(func(c *config) { c.serialWriters = true }) }

// peersRule is what Peers relaxes, printed with a failing case's rule.
const peersRule = "racers are spread over the nodes; a racer whose claim or commit lost to another node's " +
	"may fail with core.ErrLostRace instead of returning the winner's record"

// Peers declares a store on one node of a multi-primary cluster (MariaDB
// Galera) and gives, for a store s that newStore returned, stores on the
// other nodes over the same records. The race cases (ClaimRace,
// ClaimRaceExpired, ClaimRaceTakeover, AtomicClaimRace) then spread their
// racers over s and its peers. A node cannot see another node's
// uncommitted claim, so a racer may fail with an error matching
// core.ErrLostRace (its claim or its commit lost certification); exactly
// one racer still wins, and no other commits a claim. Every other case
// runs on s alone. The peers should read what other nodes committed
// (Galera: wsrep_sync_wait=1), since the cases read back the winner's
// record from s.
func Peers(peers func(t *testing.T, s store.Store) []store.Store) Option {
	return optionFunc(func(c *config) { c.peers = peers })
}

// testCase is one rule of the contract and the check of it.
type testCase struct {
	name string // subtest name, CamelCase, names the behaviour
	rule string // one sentence, printed when the case fails
	fn   func(t *testing.T, s store.Store, cfg config)
}

// cases is the suite, in the order it runs.
var cases = []testCase{
	{"ClaimAbsent", "Claiming an absent identity creates an in-progress record (Attempt 1, CreatedAt = Now, no response) that Claim returns and Get reads back with every field as requested.", plain(testClaimAbsent)},
	{"ClaimExisting", "Claiming an identity that has a live record writes nothing and returns that record, whatever the new request carries (token, fingerprint, Takeover of a live lease).", plain(testClaimExisting)},
	{"IndependentIDs", "Records with different IDs never affect each other.", plain(testIndependentIDs)},
	{"ClaimRace", "Of concurrent claims of one absent identity exactly one wins, and every other returns the winner's record.", testClaimRace},
	{"ClaimRaceExpired", "Of concurrent claims of one expired identity exactly one replaces the record, and every other returns the winner's record.", testClaimRaceExpired},
	{"ClaimRaceTakeover", "Of concurrent takeovers of one lapsed lease exactly one wins (Attempt 2), and every other returns the winner's record.", testClaimRaceTakeover},
	{"Fencing", "Complete, Extend and Release with a token other than the holder's fail with ErrFenced and change nothing; the holder's token succeeds.", plain(testFencing)},
	{"Takeover", "With Takeover, a claim of an in-progress record whose lease lapsed (LeaseUntil <= Now) takes it over (token, lease, expiry and fingerprint from the request, Attempt+1, CreatedAt kept) and fences the old token everywhere.", plain(testTakeover)},
	{"TakeoverNotRequested", "Without Takeover, a claim of a lapsed lease returns the record unchanged and writes nothing.", plain(testTakeoverNotRequested)},
	{"LiveLeaseKept", "A lease that has not lapsed (LeaseUntil > Now) or a zero lease (atomic mode) is never taken over.", plain(testLiveLeaseKept)},
	{"Extend", "Extend moves LeaseUntil, raises ExpiresAt to at least the new lease and never lowers it, and refuses a record that is not in progress with ErrFenced.", plain(testExtend)},
	{"ExpiredIsAbsent", "Get reports ErrNotFound for a record with ExpiresAt <= now, whatever its state, even before a sweep deletes it.", plain(testExpiredIsAbsent)},
	{"ClaimExpired", "Claiming an expired record, in any state, replaces it with a fresh one (Attempt 1, CreatedAt = Now, no response, the new fingerprint) and fences the old token.", plain(testClaimExpired)},
	{"DeletedRecord", "Once a record is deleted (swept or released), Complete and Extend with its token fail with ErrFenced and Release with it returns nil.", plain(testDeletedRecord)},
	{"Fingerprint", "A fingerprint round-trips byte for byte; nil and empty both mean no fingerprint and read back with length 0.", plain(testFingerprint)},
	{"ResponseBytes", "Complete keeps Status and Response byte for byte (every byte value, 1 MiB of random bytes; nil and empty read back with length 0) and clears LeaseUntil.", plain(testResponseBytes)},
	{"NoAliasing", "A store keeps its own copy of byte slices: changing a slice after passing it in, or one the store returned, never changes the record.", plain(testNoAliasing)},
	{"Indeterminate", "An indeterminate record is returned to claims (never taken over, it has no lease) and cannot be extended; its token settles it with Complete or Release.", plain(testIndeterminate)},
	{"CompletedIsFinal", "A completed record cannot be released, completed again or extended (ErrFenced) and stays as it was.", plain(testCompletedIsFinal)},
	{"Release", "Release with the holder's token deletes an in-progress record, so the next claim starts afresh at Attempt 1; releasing an absent record returns nil.", plain(testRelease)},
	{"DebugFields", "Caller, Scope and Key of MaxDebugLen bytes of multi-byte UTF-8 round-trip exactly.", plain(testDebugFields)},
	{"DeleteExpiredBatches", "DeleteExpired deletes at most limit records with ExpiresAt <= now per call, reports how many, and leaves live records alone.", plain(testDeleteExpiredBatches)},
	{"DeleteExpiredConcurrent", "Concurrent DeleteExpired calls delete each expired record exactly once.", plain(testDeleteExpiredConcurrent)},
	{"CancelledContext", "With a cancelled context every method fails with an error that is not ErrNotFound or ErrFenced (those would be read as answers) and writes nothing.", plain(testCancelledContext)},
	{"ListOrder", "List returns the live records of the state asked for, oldest first (by CreatedAt, then ID bytewise), each as Get reads it but without its Response, and the Cursor of a page's last record lists the rest, each record once.", inspectCase(testListOrder)},
	{"ListFilters", "List leaves out records of other states, records expired at Now (ExpiresAt <= Now), released ones and, with CreatedBefore, records created at or after it.", inspectCase(testListFilters)},
	{"ListInvalid", "List refuses a query whose State is not in_progress, completed or indeterminate, or whose Limit is not 1 to MaxListLimit, with an error wrapping ErrConfig.", inspectCase(testListInvalid)},
	{"SettleDue", "Due returns the live marks with After <= now, earliest After first, at most limit, each with its record as Get reads it (without Response) and the mark as written (Route, Request byte for byte, After, Tries); it refuses a limit outside 1 to MaxListLimit with ErrConfig.", settleCase(testSettleDue)},
	{"SettleStale", "Due returns only marks whose record is live, in progress or indeterminate, under the mark's token: the marks of records completed, released, never claimed, claimed again under another token or expired are never returned.", settleCase(testSettleStale)},
	{"SettleVisit", "Visit moves a mark (After and Tries as given) only with the mark's token and the After it was read with, and of concurrent visits of one reading exactly one succeeds; Mark replaces an earlier mark of the ID.", settleCase(testSettleVisit)},
	{"SettleClaim", "A claim that carries a mark (ClaimRequest.Mark) writes it with the record, when and only when it claims: the new record, a takeover's (under its token) and an expired record claimed again are due without any Mark call, with the mark as given (the store keeps its own copy of Request); a duplicate that does not claim leaves the holder's mark; a claim without one writes none.", settleCase(testSettleClaim)},
	{"SettleAtomic", "A mark written in a transaction, by the claim (ClaimRequest.Mark) or by Mark, is returned by Due once the transaction commits, and never when it rolls back; a takeover's mark rolled back leaves the earlier mark.", settleCase(testSettleAtomic)},
	{"AtomicRollback", "A claim whose transaction rolls back leaves the identity absent, even if the transaction also completed it.", atomicCase(testAtomicRollback)},
	{"AtomicCommit", "A transaction sees its own claim and completion, and once it commits everyone sees the completed record.", atomicCase(testAtomicCommit)},
	{"AtomicConcurrentClaim", "While a transaction holds a claim, a claim of the same ID from another transaction or from outside any returns at once with Claimed false and StateInProgress, and claims of other IDs proceed.", atomicCase(testAtomicConcurrentClaim)},
	{"AtomicUncommittedInvisible", "Outside its transaction an uncommitted completion is never visible: Get does not return it and Claim reports the identity in progress.", atomicCase(testAtomicUncommittedInvisible)},
	{"AtomicClaimRace", "Of concurrent transactions claiming one absent identity exactly one wins.", atomicCase(testAtomicClaimRace)},
	{"AtomicInTx", "InTx reports true for the context from Begin and contexts derived from it, false for any other.", atomicCase(testAtomicInTx)},
}

// plain adapts a case that every store passes alike.
func plain(fn func(t *testing.T, s store.Store)) func(t *testing.T, s store.Store, cfg config) {
	return func(t *testing.T, s store.Store, _ config) { fn(t, s) }
}

// atomicCase adapts a case of atomic mode; it is skipped for stores that
// do not implement store.TxStore.
func atomicCase(fn func(t *testing.T, s store.TxStore, cfg config)) func(t *testing.T, s store.Store, cfg config) {
	return func(t *testing.T, s store.Store, cfg config) {
		ts, ok := s.(store.TxStore)
		if !ok {
			t.Skipf("%T does not implement store.TxStore: atomic mode does not apply", s)
		}
		fn(t, ts, cfg)
	}
}

// Times and durations the cases use; all are whole milliseconds.
var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	lease     = 30 * time.Second
	retention = 24 * time.Hour
	// failsafe bounds a call that must not block, so that a blocking store
	// fails the case instead of hanging the run. It is not a latency bound.
	failsafe = 5 * time.Second
)

// at returns the suite's time d after base.
func at(d time.Duration) time.Time { return base.Add(d) }

// newID returns a deterministic ID, distinct per name and i.
func newID(name string, i int) store.ID {
	return sha256.Sum256(fmt.Appendf(nil, "storetest %s %d", name, i))
}

// fingerprint returns a 32-byte fingerprint, distinct per n.
func fingerprint(n int) []byte {
	h := sha256.Sum256(fmt.Appendf(nil, "request %d", n))
	return h[:]
}

// claimAt returns a leased-mode claim of id by token at now, with the
// default lease and retention.
func claimAt(id store.ID, token int64, now time.Time) store.ClaimRequest {
	return store.ClaimRequest{
		ID:          id,
		Caller:      "acct_1Nv0FGQ9RKHgCVdK",
		Scope:       "POST /v1/orders/{id}/refunds",
		Key:         "8e03978e-40d5-43e8-bc93-6894a57f9324",
		Fingerprint: fingerprint(1),
		Token:       token,
		Now:         now,
		LeaseUntil:  now.Add(lease),
		ExpiresAt:   now.Add(retention),
	}
}

// fresh returns the record a successful claim of req creates.
func fresh(req store.ClaimRequest) store.Record {
	return store.Record{
		ID:          req.ID,
		Caller:      req.Caller,
		Scope:       req.Scope,
		Key:         req.Key,
		Fingerprint: req.Fingerprint,
		State:       store.StateInProgress,
		Token:       req.Token,
		Attempt:     1,
		LeaseUntil:  req.LeaseUntil,
		ExpiresAt:   req.ExpiresAt,
		CreatedAt:   req.Now,
	}
}

// completed returns r after a completion c.
func completed(r store.Record, c store.Completion) store.Record {
	r.State = c.State
	r.Status = c.Status
	r.Response = c.Response
	r.ExpiresAt = c.ExpiresAt
	r.LeaseUntil = time.Time{}
	return r
}

// done returns a completion with StateCompleted recorded at now.
func done(now time.Time, status int, body string) store.Completion {
	return store.Completion{
		State:     store.StateCompleted,
		Status:    status,
		Response:  []byte(body),
		ExpiresAt: now.Add(retention),
	}
}

// mustClaim claims req and fails t unless the claim succeeded.
func mustClaim(t *testing.T, ctx context.Context, s store.Store, req store.ClaimRequest) store.Record {
	t.Helper()
	res, err := s.Claim(ctx, req)
	if err != nil {
		t.Fatalf("Claim(%s, token %d): %v", short(req.ID), req.Token, err)
	}
	if !res.Claimed {
		t.Fatalf("Claim(%s, token %d): Claimed = false, want true (existing record: %s)",
			short(req.ID), req.Token, describe(res.Record))
	}
	return res.Record
}

// mustNotClaim claims req and fails t unless an existing record blocked it.
func mustNotClaim(t *testing.T, ctx context.Context, s store.Store, req store.ClaimRequest) store.Record {
	t.Helper()
	res, err := s.Claim(ctx, req)
	if err != nil {
		t.Fatalf("Claim(%s, token %d): %v", short(req.ID), req.Token, err)
	}
	if res.Claimed {
		t.Fatalf("Claim(%s, token %d): Claimed = true, want false (record: %s)",
			short(req.ID), req.Token, describe(res.Record))
	}
	return res.Record
}

// mustGet reads the live record id and fails t unless there is one.
func mustGet(t *testing.T, ctx context.Context, s store.Store, id store.ID, now time.Time) store.Record {
	t.Helper()
	r, err := s.Get(ctx, id, now)
	if err != nil {
		t.Fatalf("Get(%s, %s): %v", short(id), stamp(now), err)
	}
	return r
}

// wantAbsent fails t unless Get reports ErrNotFound for id at now.
func wantAbsent(t *testing.T, ctx context.Context, s store.Store, id store.ID, now time.Time) {
	t.Helper()
	r, err := s.Get(ctx, id, now)
	if !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Get(%s, %s) = (%s, %v), want ErrNotFound", short(id), stamp(now), describe(r), err)
	}
}

// wantOK fails t if err, the result of op, is not nil.
func wantOK(t *testing.T, op string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v, want success", op, err)
	}
}

// wantFenced fails t unless err, the result of op, matches ErrFenced.
func wantFenced(t *testing.T, op string, err error) {
	t.Helper()
	if !errors.Is(err, core.ErrFenced) {
		t.Errorf("%s: error %v, want ErrFenced", op, err)
	}
}

// checkRecord fails t, listing every differing field, unless got equals
// want. Byte slices of length 0 are equal whether nil or not; times are
// equal within a millisecond, and a zero time only equals a zero time.
func checkRecord(t *testing.T, what string, got, want store.Record) {
	t.Helper()
	var diffs []string
	diff := func(field string, g, w any) {
		diffs = append(diffs, fmt.Sprintf("%s: got %v, want %v", field, g, w))
	}
	if got.ID != want.ID {
		diff("ID", short(got.ID), short(want.ID))
	}
	if got.Caller != want.Caller {
		diff("Caller", quote(got.Caller), quote(want.Caller))
	}
	if got.Scope != want.Scope {
		diff("Scope", quote(got.Scope), quote(want.Scope))
	}
	if got.Key != want.Key {
		diff("Key", quote(got.Key), quote(want.Key))
	}
	if d := bytesDiff(got.Fingerprint, want.Fingerprint); d != "" {
		diffs = append(diffs, "Fingerprint: "+d)
	}
	if got.State != want.State {
		diff("State", got.State, want.State)
	}
	if got.Token != want.Token {
		diff("Token", got.Token, want.Token)
	}
	if got.Attempt != want.Attempt {
		diff("Attempt", got.Attempt, want.Attempt)
	}
	for _, f := range []struct {
		name      string
		got, want time.Time
	}{
		{"LeaseUntil", got.LeaseUntil, want.LeaseUntil},
		{"ExpiresAt", got.ExpiresAt, want.ExpiresAt},
		{"CreatedAt", got.CreatedAt, want.CreatedAt},
	} {
		if !sameTime(f.got, f.want) {
			diff(f.name, stamp(f.got), stamp(f.want))
		}
	}
	if got.Status != want.Status {
		diff("Status", got.Status, want.Status)
	}
	if d := bytesDiff(got.Response, want.Response); d != "" {
		diffs = append(diffs, "Response: "+d)
	}
	if len(diffs) > 0 {
		t.Errorf("%s: record differs:\n\t%s", what, strings.Join(diffs, "\n\t"))
	}
}

// sameTime reports whether a and b are the same instant within the
// precision the suite grants stores (under a millisecond); a zero time only
// matches a zero time.
func sameTime(a, b time.Time) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() && b.IsZero()
	}
	d := a.Sub(b)
	return d > -time.Millisecond && d < time.Millisecond
}

// bytesDiff describes how got differs from want, or returns "" when they
// hold the same bytes (nil and empty are the same).
func bytesDiff(got, want []byte) string {
	if bytes.Equal(got, want) {
		return ""
	}
	if len(got) <= 64 && len(want) <= 64 {
		return fmt.Sprintf("got %x (%d bytes), want %x (%d bytes)", got, len(got), want, len(want))
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("got %d bytes, want %d bytes, first difference at byte %d", len(got), len(want), i)
}

// describe formats a record briefly for failure messages.
func describe(r store.Record) string {
	return fmt.Sprintf("{ID %s, State %v, Token %d, Attempt %d, LeaseUntil %s, ExpiresAt %s}",
		short(r.ID), r.State, r.Token, r.Attempt, stamp(r.LeaseUntil), stamp(r.ExpiresAt))
}

// short abbreviates an ID for messages.
func short(id store.ID) string { return id.String()[:12] }

// stamp formats t relative to the suite's base time, the way cases write it.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "zero"
	}
	return "base" + signed(t.Sub(base))
}

func signed(d time.Duration) string {
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}

func quote(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q... (%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// race runs f(0) ... f(n-1) in n goroutines released together, and waits
// for all of them.
func race(n int, f func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			f(i)
		})
	}
	close(start)
	wg.Wait()
}

// within runs f and returns its results, or fails t when f has not returned
// after the failsafe timeout: what must not block. f runs in its own
// goroutine and must not use t; it is left behind on timeout (the context
// of t, which it should use, is cancelled when the test ends).
func within[T any](t *testing.T, what string, f func(ctx context.Context) (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	ctx := t.Context()
	go func() {
		v, err := f(ctx)
		ch <- result{v, err}
	}()
	timer := time.NewTimer(failsafe)
	defer timer.Stop()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-timer.C:
		t.Fatalf("%s has not returned after %v: the store blocks", what, failsafe)
	}
	panic("unreachable")
}
