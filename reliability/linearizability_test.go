package reliability

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// This file checks that every store is linearizable with respect to a
// sequential model of the contract in core/store.go: concurrent clients run
// random operations on a few keys, the history (call and return instants,
// inputs, outputs) is recorded, and porcupine searches for a sequential
// order, consistent with real time, in which the model gives every output
// that was observed. Histories are partitioned by key (the contract is per
// record).
//
// Times are logical: a shared clock in milliseconds that clients advance at
// random, so leases lapse (takeovers) and records expire while other clients
// still hold them (the "expired but not yet swept or claimed again" case).
// Each operation carries its own Now, as the contract says a store never
// reads a clock.
//
// Transactions (TxStore): a client may Begin and Claim (one operation,
// TxClaim) and later end the transaction (TxEnd: Complete then Commit,
// Release then Commit, or Rollback). Meanwhile the identity is held: other
// clients' claims may be told "in progress" without a record (the lock
// probe), their Gets see the committed record, and their Extend, Complete
// and Release either wait for the transaction (SQL) or are fenced at once
// (memstore); the model accepts both.

// linKind is the kind of a recorded operation.
type linKind uint8

const (
	kClaim linKind = iota
	kTxClaim
	kTxEnd
	kExtend
	kComplete
	kRelease
	kGet
	kSweep
)

var kindNames = [...]string{"Claim", "TxClaim", "TxEnd", "Extend", "Complete", "Release", "Get", "Sweep"}

// txEnding is how TxEnd ends a transaction.
type txEnding uint8

const (
	endComplete         txEnding = iota // Complete, Commit
	endRelease                          // Release, Commit
	endRollback                         // Rollback
	endCompleteRollback                 // Complete, Rollback
)

var endNames = [...]string{"complete+commit", "release+commit", "rollback", "complete+rollback"}

// linIn is the input of an operation; times are logical milliseconds (0:
// the zero time).
type linIn struct {
	kind     linKind
	key      int
	token    int64
	now      int64
	lease    int64 // Claim: LeaseUntil; Extend: the new lease
	expires  int64 // Claim, Complete: ExpiresAt
	takeover bool
	fp       uint8 // Claim: the fingerprint (0: none)
	state    store.State
	status   int
	resp     uint32 // Complete: the response's marker (0: none)
	end      txEnding
}

// linRec is a record as the model keeps it (comparable).
type linRec struct {
	present                 bool
	state                   store.State
	token                   int64
	attempt                 int
	lease, expires, created int64
	status                  int
	resp                    uint32
	fp                      uint8
}

type errClass uint8

const (
	errNone errClass = iota
	errFenced
	errNotFound
	errOther
)

// linOut is the output of an operation.
type linOut struct {
	err     errClass
	claimed bool
	busy    bool // Claim: held elsewhere, a record with only ID and State
	rec     linRec
	msg     string
}

// linState is the model's state of one record.
type linState struct {
	c      linRec // committed
	held   bool   // an open transaction holds the identity
	holder int64  // its token
	p      linRec // the record as the holding transaction sees it
}

// --- the model ---------------------------------------------------------------

func live(r linRec, now int64) bool { return r.present && r.expires > now }

// claimOn is Claim on cur, per the contract: (claimed, the new record).
func claimOn(cur linRec, in linIn) (bool, linRec) {
	switch {
	case !live(cur, in.now):
		return true, linRec{present: true, state: store.StateInProgress, token: in.token, attempt: 1,
			lease: in.lease, expires: in.expires, created: in.now, fp: in.fp}
	case in.takeover && cur.state == store.StateInProgress && cur.lease != 0 && cur.lease <= in.now:
		n := cur
		n.fp, n.token, n.attempt, n.lease, n.expires = in.fp, in.token, cur.attempt+1, in.lease, in.expires
		return true, n
	}
	return false, cur
}

func complete(r linRec, in linIn) linRec {
	r.state, r.status, r.resp, r.expires, r.lease = in.state, in.status, in.resp, in.expires, 0
	return r
}

// linStep is the model: every state the record can be in after the
// operation in on s, given that it answered out; none when it could not
// have answered that.
func linStep(s linState, in linIn, out linOut) []linState {
	one := []linState{s}
	if out.err == errOther {
		return unknownOutcome(s, in)
	}
	switch in.kind {
	case kClaim, kTxClaim:
		if out.err != errNone {
			return nil
		}
		claimable, next := claimOn(s.c, in)
		if out.busy {
			// "Another transaction holds the identity": a statement about
			// a concurrent holder (a transaction, or a claim or write in
			// flight that may not have taken effect yet), not about the
			// committed record, so any state may answer it. checkBusy
			// makes sure a holder did overlap.
			return one
		}
		if s.held {
			// A store may answer from the committed record when it is
			// live and not claimable (MySQL reads it past the lock).
			if !out.claimed && !claimable && out.rec == s.c {
				return one
			}
			return nil
		}
		if !claimable {
			if !out.claimed && out.rec == s.c {
				return one
			}
			return nil
		}
		if !out.claimed || out.rec != next {
			return nil
		}
		if in.kind == kTxClaim {
			return []linState{{c: s.c, held: true, holder: in.token, p: next}}
		}
		return []linState{{c: next}}

	case kTxEnd:
		if !s.held || s.holder != in.token || out.err != errNone {
			return nil
		}
		n := linState{c: s.c}
		switch in.end {
		case endComplete:
			n.c = complete(s.p, in)
		case endRelease:
			n.c = linRec{}
		}
		return []linState{n}

	case kExtend, kComplete, kRelease:
		if s.held {
			// memstore: fenced at once. SQL: a row the transaction
			// updated is locked (the operation waits, and linearizes
			// after the transaction ends); a row it inserted is invisible,
			// so the operation acts on the committed state: absent.
			if out.err == errFenced || (in.kind == kRelease && out.err == errNone && !s.c.present) {
				return one
			}
			return nil
		}
		c := s.c
		var ok bool
		switch in.kind {
		case kExtend:
			ok = c.present && c.state == store.StateInProgress && c.token == in.token
			c.lease = in.lease
			c.expires = max(c.expires, in.lease)
		case kComplete:
			ok = c.present && c.state != store.StateCompleted && c.token == in.token
			c = complete(c, in)
		case kRelease:
			if !s.c.present {
				if out.err == errNone {
					return one
				}
				return nil
			}
			ok = c.token == in.token && c.state != store.StateCompleted
			c = linRec{}
		}
		switch {
		case ok && out.err == errNone:
			return []linState{{c: c}}
		case !ok && out.err == errFenced:
			return one
		}
		return nil

	case kGet:
		if live(s.c, in.now) {
			if out.err == errNone && out.rec == s.c {
				return one
			}
			return nil
		}
		if out.err == errNotFound {
			return one
		}
		return nil

	case kSweep:
		if out.err != errNone {
			return nil
		}
		if !s.held && s.c.present && !live(s.c, in.now) {
			// Deleted, or skipped because a concurrent writer locked
			// the row (SKIP LOCKED); never a live record.
			return []linState{{}, s}
		}
		return one
	}
	return nil
}

// unknownOutcome is what an operation that failed with a store error
// (ErrStoreUnavailable: a deadlock victim, a lost connection) may have
// done: nothing, or what it would have done had it succeeded. A failed
// transactional claim was rolled back; a failed TxEnd ended the transaction
// one way or the other.
func unknownOutcome(s linState, in linIn) []linState {
	states := []linState{s}
	switch in.kind {
	case kClaim:
		if claimable, next := claimOn(s.c, in); claimable && !s.held {
			states = append(states, linState{c: next})
		}
	case kTxEnd:
		if s.held && s.holder == in.token {
			states = append(linStep(s, in, linOut{}), linState{c: s.c})
		}
	case kExtend, kComplete, kRelease:
		if !s.held {
			states = append(states, linStep(s, in, linOut{})...)
		}
	}
	return states
}

func describeRec(r linRec) string {
	if !r.present {
		return "absent"
	}
	return fmt.Sprintf("{%v tok=%d att=%d lease=%d exp=%d created=%d status=%d resp=%d fp=%d}",
		r.state, r.token%100000, r.attempt, r.lease, r.expires, r.created, r.status, r.resp, r.fp)
}

func describeOp(in linIn, out linOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s(key=%d tok=%d now=%d", kindNames[in.kind], in.key, in.token%100000, in.now)
	switch in.kind {
	case kClaim, kTxClaim:
		fmt.Fprintf(&b, " lease=%d exp=%d takeover=%v fp=%d", in.lease, in.expires, in.takeover, in.fp)
	case kExtend:
		fmt.Fprintf(&b, " lease=%d", in.lease)
	case kComplete:
		fmt.Fprintf(&b, " %v status=%d resp=%d exp=%d", in.state, in.status, in.resp, in.expires)
	case kTxEnd:
		fmt.Fprintf(&b, " %s", endNames[in.end])
		if in.end == endComplete || in.end == endCompleteRollback {
			fmt.Fprintf(&b, " %v status=%d resp=%d exp=%d", in.state, in.status, in.resp, in.expires)
		}
	}
	b.WriteString(") -> ")
	switch {
	case out.err == errFenced:
		b.WriteString("ErrFenced")
	case out.err == errNotFound:
		b.WriteString("ErrNotFound")
	case out.err == errOther:
		b.WriteString("error: " + out.msg)
	case out.busy:
		b.WriteString("busy (held by another transaction)")
	case in.kind == kClaim || in.kind == kTxClaim:
		fmt.Fprintf(&b, "claimed=%v %s", out.claimed, describeRec(out.rec))
	case in.kind == kGet:
		b.WriteString(describeRec(out.rec))
	default:
		b.WriteString("ok")
	}
	return b.String()
}

var linModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		// DeleteExpired touches every key: it belongs to every partition
		// (the contract does not make it atomic across keys, so each
		// partition may place it on its own).
		byKey := map[int][]porcupine.Operation{}
		var sweeps []porcupine.Operation
		for _, op := range history {
			in := op.Input.(linIn)
			if in.kind == kSweep {
				sweeps = append(sweeps, op)
				continue
			}
			byKey[in.key] = append(byKey[in.key], op)
		}
		for k := range byKey {
			byKey[k] = append(byKey[k], sweeps...)
		}
		keys := make([]int, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{linState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		next := linStep(state.(linState), input.(linIn), output.(linOut))
		out := make([]interface{}, len(next))
		for i, s := range next {
			out[i] = s
		}
		return out
	},
	Equal:             func(a, b interface{}) bool { return a.(linState) == b.(linState) },
	DescribeOperation: func(in, out interface{}) string { return describeOp(in.(linIn), out.(linOut)) },
	DescribeState: func(s interface{}) string {
		st := s.(linState)
		if st.held {
			return fmt.Sprintf("held by %d: %s; committed %s", st.holder%100000, describeRec(st.p), describeRec(st.c))
		}
		return describeRec(st.c)
	},
}

// --- recording histories -----------------------------------------------------

// logical time: milliseconds after linBase.
var linBase = time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)

func lt(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return linBase.Add(time.Duration(ms) * time.Millisecond)
}

// ms converts a stored time back; a time off the millisecond grid (or
// before the base) becomes -1, which the model never produces.
func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	d := t.Sub(linBase)
	if d <= 0 || d%time.Millisecond != 0 {
		return -1
	}
	return int64(d / time.Millisecond)
}

func fromRecord(r store.Record) linRec {
	lr := linRec{present: true, state: r.State, token: r.Token, attempt: r.Attempt,
		lease: ms(r.LeaseUntil), expires: ms(r.ExpiresAt), created: ms(r.CreatedAt), status: r.Status}
	switch len(r.Fingerprint) {
	case 0:
	case 1:
		lr.fp = r.Fingerprint[0]
	default:
		lr.fp = 255 // never given
	}
	if len(r.Response) > 0 {
		n, err := strconv.ParseUint(string(r.Response), 10, 32)
		if err != nil || n == 0 {
			n = 1<<32 - 1
		}
		lr.resp = uint32(n)
	}
	return lr
}

func classify(err error) (errClass, string) {
	switch {
	case err == nil:
		return errNone, ""
	case errors.Is(err, core.ErrFenced):
		return errFenced, ""
	case errors.Is(err, core.ErrNotFound):
		return errNotFound, ""
	}
	return errOther, err.Error()
}

// linTarget is a store under test.
type linTarget struct {
	store store.Store
	tx    store.TxStore // nil: no transactions
	// unavailable, when set, tolerates operations that fail with
	// ErrStoreUnavailable (their outcome is then unknown to the model) and
	// says why; otherwise any such failure fails the test.
	unavailable string
}

// linConfig sizes one recorded history.
type linConfig struct {
	clients, opsPerClient, keys int
}

// linClient is one client's memory: the tokens it claimed, per key, and
// its open transaction.
type linClient struct {
	rng    *rand.Rand
	tokens map[int]int64
	txKey  int
	txTok  int64
	txCtx  context.Context
	tx     store.Tx
}

// record runs cfg.clients clients against target for one history of round
// and returns it, with the number of operations that failed with an
// unexpected error.
func record(t *testing.T, target linTarget, cfg linConfig, seed uint64, round int) []porcupine.Operation {
	ids := make([]store.ID, cfg.keys)
	for k := range ids {
		ids[k] = store.Identity{Caller: "lin", Scope: fmt.Sprintf("round %d", round), Key: strconv.Itoa(k)}.ID()
	}
	var (
		clock    atomic.Int64 // logical ms
		shared   = make([]atomic.Int64, cfg.keys)
		respSeq  atomic.Uint32
		mu       sync.Mutex
		history  []porcupine.Operation
		start    = time.Now()
		wg       sync.WaitGroup
		tokenSeq atomic.Int64
		failures atomic.Int64
	)
	clock.Store(1000)
	tokenSeq.Store(int64(seed%1000)*1_000_000 + int64(round)*10_000 + 1)
	for c := range cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &linClient{rng: rand.New(rand.NewPCG(seed, uint64(round)<<16|uint64(c))), tokens: map[int]int64{}}
			for i := 0; i < cfg.opsPerClient || cl.tx != nil; i++ { // end with no open transaction
				in := nextOp(cl, target, cfg, &clock, shared, &respSeq, &tokenSeq)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				call := time.Since(start).Nanoseconds()
				var id store.ID
				if in.key >= 0 {
					id = ids[in.key]
				}
				out := runOp(ctx, cl, target, id, in)
				ret := time.Since(start).Nanoseconds()
				cancel()
				if out.err == errOther {
					if target.unavailable == "" {
						t.Errorf("client %d: %s", c, describeOp(in, out))
					} else {
						failures.Add(1)
						if failures.Load() <= 3 {
							t.Logf("client %d: %s (tolerated: %s)", c, describeOp(in, out), target.unavailable)
						}
					}
				}
				if (in.kind == kClaim || in.kind == kTxClaim) && out.claimed {
					cl.tokens[in.key] = in.token
					shared[in.key].Store(in.token)
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Logf("%d operations failed with a store error (outcome unknown to the model): %s", n, target.unavailable)
	}
	return history
}

// nextOp draws the client's next operation.
func nextOp(cl *linClient, target linTarget, cfg linConfig, clock *atomic.Int64, shared []atomic.Int64, respSeq *atomic.Uint32, tokenSeq *atomic.Int64) linIn {
	r := cl.rng
	if r.IntN(5) == 0 { // time passes: leases lapse, records expire
		clock.Add(int64(r.IntN(700)))
	}
	now := clock.Load()
	in := linIn{now: now, key: r.IntN(cfg.keys)}
	if cl.tx != nil {
		in.kind, in.key, in.token = kTxEnd, cl.txKey, cl.txTok
		in.end = txEnding(r.IntN(4))
		if r.IntN(3) > 0 {
			in.end = endComplete // mostly what the engine does
		}
		in.state, in.status, in.resp, in.expires = store.StateCompleted, 201, respSeq.Add(1), now+1000+int64(r.IntN(5000))
		return in
	}
	// token: the client's own claim of the key, another client's, or junk
	token := func() int64 {
		switch p := r.IntN(10); {
		case p < 6 && cl.tokens[in.key] != 0:
			return cl.tokens[in.key]
		case p < 9 && shared[in.key].Load() != 0:
			return shared[in.key].Load()
		}
		return tokenSeq.Add(1)
	}
	switch p := r.IntN(100); {
	case p < 28 || (p < 43 && target.tx == nil):
		in.kind, in.token = kClaim, tokenSeq.Add(1)
		in.lease = now + 300 + int64(r.IntN(2000))
		in.expires = max(in.lease, now+500+int64(r.IntN(5000)))
		in.takeover = r.IntN(5) > 0
		in.fp = uint8(r.IntN(3))
	case p < 43:
		in.kind, in.token = kTxClaim, tokenSeq.Add(1)
		in.expires = now + 500 + int64(r.IntN(5000))
		in.takeover = r.IntN(5) > 0
		in.fp = uint8(r.IntN(3))
	case p < 55:
		in.kind, in.token = kExtend, token()
		in.lease = now + 300 + int64(r.IntN(2000))
	case p < 72:
		in.kind, in.token = kComplete, token()
		in.state, in.status = store.StateCompleted, 201
		if r.IntN(4) == 0 {
			in.state, in.status = store.StateIndeterminate, 502
		}
		in.resp = respSeq.Add(1)
		in.expires = now + 500 + int64(r.IntN(6000))
	case p < 82:
		in.kind, in.token = kRelease, token()
	case p < 97:
		in.kind = kGet
	default:
		in.kind, in.key = kSweep, -1 // every key
	}
	return in
}

// runOp runs in against the store.
func runOp(ctx context.Context, cl *linClient, target linTarget, id store.ID, in linIn) linOut {
	st := target.store
	var out linOut
	var err error
	switch in.kind {
	case kClaim, kTxClaim:
		req := store.ClaimRequest{ID: id, Caller: "lin", Scope: "s", Key: strconv.Itoa(in.key), Token: in.token,
			Now: lt(in.now), LeaseUntil: lt(in.lease), ExpiresAt: lt(in.expires), Takeover: in.takeover}
		if in.fp != 0 {
			req.Fingerprint = []byte{in.fp}
		}
		cctx := ctx
		var tx store.Tx
		if in.kind == kTxClaim {
			cctx, tx, err = target.tx.Begin(context.Background())
			if err != nil {
				out.err, out.msg = classify(err)
				return out
			}
		}
		var res store.ClaimResult
		res, err = st.Claim(cctx, req)
		if tx != nil {
			if err == nil && res.Claimed {
				cl.tx, cl.txCtx, cl.txKey, cl.txTok = tx, cctx, in.key, in.token
			} else {
				_ = tx.Rollback()
			}
		}
		if err == nil {
			out.claimed = res.Claimed
			if !res.Claimed && res.Record.Token == 0 && res.Record.Attempt == 0 && res.Record.State == store.StateInProgress {
				out.busy = true
			} else {
				out.rec = fromRecord(res.Record)
			}
		}
	case kTxEnd:
		tx, tctx := cl.tx, cl.txCtx
		cl.tx, cl.txCtx = nil, nil
		c := store.Completion{State: in.state, Status: in.status, Response: []byte(strconv.FormatUint(uint64(in.resp), 10)), ExpiresAt: lt(in.expires)}
		switch in.end {
		case endComplete:
			if err = st.Complete(tctx, id, in.token, c); err == nil {
				err = tx.Commit()
			}
		case endRelease:
			if err = st.Release(tctx, id, in.token); err == nil {
				err = tx.Commit()
			}
		case endRollback:
			err = tx.Rollback()
		case endCompleteRollback:
			if err = st.Complete(tctx, id, in.token, c); err == nil {
				err = tx.Rollback()
			}
		}
		if err != nil {
			_ = tx.Rollback()
		}
	case kExtend:
		err = st.Extend(ctx, id, in.token, lt(in.lease))
	case kComplete:
		err = st.Complete(ctx, id, in.token, store.Completion{State: in.state, Status: in.status,
			Response: []byte(strconv.FormatUint(uint64(in.resp), 10)), ExpiresAt: lt(in.expires)})
	case kRelease:
		err = st.Release(ctx, id, in.token)
	case kGet:
		var rec store.Record
		if rec, err = st.Get(ctx, id, lt(in.now)); err == nil {
			out.rec = fromRecord(rec)
		}
	case kSweep:
		_, err = st.DeleteExpired(ctx, lt(in.now), 10_000)
	}
	if err != nil {
		out.err, out.msg = classify(err)
	}
	return out
}

// checkBusy checks what the model cannot: every "busy" answer to a claim
// overlaps in time with something that could hold the identity: another
// client's operation on the key that writes (or locks) it, or a transaction
// holding it (from its TxClaim to its TxEnd).
func checkBusy(t *testing.T, name string, history []porcupine.Operation, seed uint64, round int) {
	t.Helper()
	type span struct {
		client    int
		call, ret int64
		key       int
		what      string
	}
	var holders []span
	open := map[int]porcupine.Operation{} // client -> its TxClaim
	for _, op := range slices.SortedFunc(slices.Values(history), func(a, b porcupine.Operation) int { return int(a.Call - b.Call) }) {
		in, out := op.Input.(linIn), op.Output.(linOut)
		switch in.kind {
		case kGet:
			continue
		case kTxClaim:
			if out.claimed {
				open[op.ClientId] = op
				continue
			}
		case kTxEnd:
			if c, ok := open[op.ClientId]; ok {
				holders = append(holders, span{op.ClientId, c.Call, op.Return, in.key, "transaction"})
				delete(open, op.ClientId)
				continue
			}
		}
		holders = append(holders, span{op.ClientId, op.Call, op.Return, in.key, kindNames[in.kind]})
	}
	for _, op := range history {
		in, out := op.Input.(linIn), op.Output.(linOut)
		if !out.busy {
			continue
		}
		found := false
		for _, h := range holders {
			if h.client != op.ClientId && (h.key == in.key || h.key < 0) && h.call <= op.Return && op.Call <= h.ret {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s: a claim was told the identity is held, and nothing held it (seed %d, round %d): [%d,%d] c%d %s",
				name, seed, round, op.Call/1000, op.Return/1000, op.ClientId, describeOp(in, out))
		}
	}
}

// check runs porcupine over history; on a violation it names the key,
// lists its operations and writes porcupine's visualization.
func check(t *testing.T, name string, history []porcupine.Operation, seed uint64, round int) {
	t.Helper()
	if report := linearizable(t, name, history, seed, round, true); report != "" {
		t.Error(report)
	}
}

// linearizable returns "" when history is linearizable (or porcupine timed
// out), else a report of the violation.
func linearizable(t *testing.T, name string, history []porcupine.Operation, seed uint64, round int, visualize bool) string {
	model := linModel.ToModel()
	res, info := porcupine.CheckOperationsVerbose(model, history, 2*time.Minute)
	switch res {
	case porcupine.Ok:
		return ""
	case porcupine.Unknown:
		t.Logf("%s round %d: porcupine timed out (%d operations); not a violation", name, round, len(history))
		return ""
	}
	var report strings.Builder
	var f *os.File
	var err error
	if visualize {
		f, err = os.CreateTemp("", "idem-linearizability-*.html")
	}
	if f != nil && err == nil {
		_ = porcupine.Visualize(model, info, f)
		f.Close()
	}
	// Find the first key whose history is not linearizable and print it.
	for _, part := range model.Partition(history) {
		single := model
		single.Partition = nil
		if porcupine.CheckOperations(single, part) {
			continue
		}
		ops := slices.Clone(part)
		slices.SortFunc(ops, func(a, b porcupine.Operation) int { return int(a.Call - b.Call) })
		// The shortest prefix (in call order) that is not linearizable
		// ends near the culprit: print it.
		lo, hi := 1, len(ops)
		for lo < hi {
			if mid := (lo + hi) / 2; porcupine.CheckOperations(single, ops[:mid]) {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		var b strings.Builder
		for i, op := range ops[:min(lo+5, len(ops))] {
			if i == lo {
				b.WriteString("  --- the prefix ends here; the next operations called:\n")
			}
			fmt.Fprintf(&b, "  [%9d,%9d] c%-2d %s\n", op.Call/1000, op.Return/1000, op.ClientId, describeOp(op.Input.(linIn), op.Output.(linOut)))
		}
		key := -1
		for _, op := range ops {
			key = max(key, op.Input.(linIn).key)
		}
		fmt.Fprintf(&report, "%s: NOT LINEARIZABLE (seed %d, round %d; rerun with -reliability.seed=%d); the shortest failing prefix of key %d's history (µs since start; the culprit is near the end):\n%s",
			name, seed, round, seed, key, b.String())
		break
	}
	if f != nil {
		fmt.Fprintf(&report, "\nvisualization: %s", f.Name())
	}
	return report.String()
}

// runLinearizability records and checks histories against newTarget's
// store: one short round, or rounds until -reliability.duration with
// -reliability.long.
func runLinearizability(t *testing.T, name string, target linTarget) {
	seed := *seedFlag
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -reliability.seed=%d)", seed, seed)
	cfg := linConfig{clients: 6, opsPerClient: 150, keys: 10}
	deadline := time.Now()
	if *long {
		cfg = linConfig{clients: 8, opsPerClient: 400, keys: 24}
		deadline = deadline.Add(*duration)
	}
	start := time.Now()
	ops := 0
	for round := 0; ; round++ {
		history := record(t, target, cfg, seed, round)
		ops += len(history)
		if t.Failed() {
			t.Fatalf("%s: unexpected store errors (seed %d, round %d)", name, seed, round)
		}
		checkBusy(t, name, history, seed, round)
		check(t, name, history, seed, round)
		if t.Failed() || !time.Now().Before(deadline) {
			t.Logf("%s: %d rounds, %d operations, %v", name, round+1, ops, time.Since(start).Round(time.Millisecond))
			return
		}
	}
}

func TestLinearizableMemstore(t *testing.T) {
	t.Parallel()
	runLinearizability(t, "memstore", linTarget{store: memstore.New()})
}

func TestLinearizableMemstoreAtomic(t *testing.T) {
	t.Parallel()
	s := memstore.New().Atomic()
	runLinearizability(t, "memstore atomic view", linTarget{store: s, tx: s})
}

// mariaDBDeadlocks is why operations on MySQL/MariaDB may fail with a
// store error. A claim that INSERTs an id whose row was just deleted takes
// a shared lock on the delete-marked record, then an exclusive one; a
// fenced writer of the same id queued in between makes it a deadlock
// (Error 1213), and InnoDB kills one of the two. Outside a transaction the
// store now retries the victim (TestMariaDBClaimOverDeletedRowRetries);
// inside one (atomic mode) the whole transaction was rolled back and the
// error is reported. The outcome of such a victim is unknown to the model
// (it was in fact rolled back), so the history is still checked. (A
// deadlock between DeleteExpired and writers is fixed:
// TestMariaDBSweepNeverDeadlocksWriters.)
const mariaDBDeadlocks = "MariaDB deadlock victim (Error 1213) inside a transaction: rolled back and reported"

func TestLinearizableGORM(t *testing.T) {
	for _, d := range sqlDialects {
		t.Run(d.String(), func(t *testing.T) {
			s := newGormStore(t, d, openDB(t, d, dsn(t, d)))
			target := linTarget{store: s, tx: s}
			if d == sqlstore.MySQL {
				target.unavailable = mariaDBDeadlocks
			}
			runLinearizability(t, "gormstore "+d.String(), target)
		})
	}
}

func TestLinearizableSQL(t *testing.T) {
	for _, d := range sqlDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := openDB(t, d, dsn(t, d))
			s := newSQLStore(t, d, db, nil)
			target := linTarget{store: s, tx: s}
			if d == sqlstore.MySQL {
				target.unavailable = mariaDBDeadlocks
			}
			runLinearizability(t, "sqlstore "+d.String(), target)
		})
	}
}

// TestLinearizablePGX runs the same histories on pgxstore (native pgx;
// atomic-mode claims pipelined with BEGIN, completions with COMMIT).
func TestLinearizablePGX(t *testing.T) {
	raw := dsn(t, sqlstore.Postgres)
	s := newPgxStore(t, raw, openDB(t, sqlstore.Postgres, raw))
	runLinearizability(t, "pgxstore postgres", linTarget{store: s, tx: s})
}

// Deliberately broken stores: the check must catch each of them, or it
// proves nothing.

// unfencedComplete completes whatever attempt holds the record.
type unfencedComplete struct{ *memstore.Store }

func (s unfencedComplete) Complete(ctx context.Context, id store.ID, _ int64, c store.Completion) error {
	rec, err := s.Store.Get(ctx, id, time.Time{})
	if err != nil {
		return core.ErrFenced
	}
	return s.Store.Complete(ctx, id, rec.Token, c)
}

// staleGet returns records up to a second after they expired.
type staleGet struct{ *memstore.Store }

func (s staleGet) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	return s.Store.Get(ctx, id, now.Add(-time.Second))
}

// eagerTakeover takes over in-progress records whose lease has not lapsed.
type eagerTakeover struct{ *memstore.Store }

func (s eagerTakeover) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	req.Now = req.Now.Add(500 * time.Millisecond)
	res, err := s.Store.Claim(ctx, req)
	if res.Claimed {
		res.Record.CreatedAt = res.Record.CreatedAt.Add(-500 * time.Millisecond)
	}
	return res, err
}

func TestLinearizabilityCatchesBrokenStores(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		store store.Store
	}{
		{"nok, Complete ignores the fencing token", unfencedComplete{memstore.New()}},
		{"nok, Get returns expired records", staleGet{memstore.New()}},
		{"nok, Claim takes over live leases", eagerTakeover{memstore.New()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caught := false
			for round := range 5 {
				history := record(t, linTarget{store: tc.store}, linConfig{clients: 6, opsPerClient: 150, keys: 10}, uint64(round)+1, round)
				if linearizable(t, tc.name, history, uint64(round)+1, round, false) != "" {
					caught = true
					break
				}
			}
			if !caught {
				t.Fatal("the linearizability check did not catch a broken store in 5 histories")
			}
		})
	}
}

// TestLinearizableSQLIsolation runs the histories on sqlstore with Begin's
// transactions at the stricter levels the claim must also hold at
// (Postgres REPEATABLE READ and SERIALIZABLE, MariaDB REPEATABLE READ):
// there a statement reads the transaction's snapshot, and a claim that
// meets a row committed after it fails with a serialization failure
// (Postgres), which Begin's claim answers by beginning again.
func TestLinearizableSQLIsolation(t *testing.T) {
	for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL} {
		levels := []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable}
		if d == sqlstore.MySQL {
			levels = levels[:1]
		}
		for _, level := range levels {
			t.Run(d.String()+"/"+level.String(), func(t *testing.T) {
				db := openDB(t, d, dsn(t, d))
				table := sqlstoretest.Table()
				s, err := sqlstore.New(db, d, sqlstore.WithTable(table), sqlstore.WithTxOptions(&sql.TxOptions{Isolation: level}))
				if err != nil {
					t.Fatal(err)
				}
				newSQLStoreOn(t, d, db, table)
				target := linTarget{store: s, tx: s}
				switch {
				case d == sqlstore.MySQL:
					target.unavailable = mariaDBDeadlocks
				case level == sql.LevelSerializable:
					// SSI aborts transactions whose reads and writes of
					// the same rows interleave (40001 at a statement or at
					// COMMIT): rolled back and reported, never applied.
					target.unavailable = "Postgres serialization failure (40001) at SERIALIZABLE: rolled back and reported"
				}
				runLinearizability(t, "sqlstore "+d.String()+" "+level.String(), target)
			})
		}
	}
}
