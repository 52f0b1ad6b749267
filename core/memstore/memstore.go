package memstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// Store is an in-memory [store.Store] (leased mode). The zero value is not
// usable; call [New]. A Store is safe for concurrent use.
type Store struct {
	mu    sync.Mutex // guards m, every slot in it, and marks
	m     map[store.ID]*slot
	marks map[store.ID]*mark // store.Settler's marks
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Inspector = (*Store)(nil)
)

// slot holds one record. Stored records are immutable: a write replaces
// rec with a new *store.Record, so prev can keep the committed value while
// an open transaction owns the slot. The byte slices of a stored record
// are private copies and are never written to, so versions of a record
// share them.
type slot struct {
	rec   *store.Record // current value; nil when the owner deleted it
	owner *memTx        // open transaction that wrote rec; nil once committed
	prev  *store.Record // committed value while owner != nil; nil: absent
	// marked: the owner's claim replaced the mark of the id; prevMark is
	// the mark it replaced (nil: none), restored if the owner rolls back.
	marked   bool
	prevMark *mark
}

// view returns the record as seen by tx (nil: outside any transaction), and
// whether another open transaction holds the slot. A nil slot is absent.
func (sl *slot) view(tx *memTx) (rec *store.Record, busy bool) {
	switch {
	case sl == nil:
		return nil, false
	case sl.owner != nil && sl.owner != tx:
		return sl.prev, true
	}
	return sl.rec, false
}

// New returns an empty Store.
func New() *Store {
	return &Store{m: make(map[store.ID]*slot)}
}

// Atomic returns a view of s that also implements [store.TxStore] (atomic
// mode). The view shares the records of s; see the package documentation
// for how its transactions behave.
func (s *Store) Atomic() *AtomicStore { return &AtomicStore{Store: s} }

// Len returns the number of records held in memory, including expired
// records that DeleteExpired has not deleted yet.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

var (
	errZeroToken    = errors.New("memstore: fencing token 0 is reserved")
	errInvalidState = errors.New("memstore: a completion must be completed or indeterminate")
)

// Claim implements [store.Store].
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	tx, err := s.txFrom(ctx)
	if err != nil {
		return store.ClaimResult{}, err
	}
	if req.Token == 0 {
		return store.ClaimResult{}, errZeroToken
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := tx.check(); err != nil {
		return store.ClaimResult{}, err
	}
	sl := s.m[req.ID]
	cur, busy := sl.view(tx)
	var r *store.Record
	switch {
	case busy:
		// What the lock probe of a SQL store reports.
		return store.ClaimResult{Record: store.Record{ID: req.ID, State: store.StateInProgress}}, nil
	case cur == nil || !live(cur, req.Now):
		r = &store.Record{
			ID:          req.ID,
			Caller:      req.Caller,
			Scope:       req.Scope,
			Key:         req.Key,
			Fingerprint: cloneBytes(req.Fingerprint),
			State:       store.StateInProgress,
			Token:       req.Token,
			Attempt:     1,
			LeaseUntil:  req.LeaseUntil.UTC(),
			ExpiresAt:   req.ExpiresAt.UTC(),
			CreatedAt:   req.Now.UTC(),
		}
	case req.Takeover && cur.State == store.StateInProgress &&
		!cur.LeaseUntil.IsZero() && !cur.LeaseUntil.After(req.Now):
		t := *cur
		t.Fingerprint = cloneBytes(req.Fingerprint)
		t.Token = req.Token
		t.Attempt++
		t.LeaseUntil = req.LeaseUntil.UTC()
		t.ExpiresAt = req.ExpiresAt.UTC()
		r = &t
	default:
		return store.ClaimResult{Record: clone(cur)}, nil
	}
	if err := s.put(req.ID, sl, tx, r); err != nil {
		return store.ClaimResult{}, err
	}
	if req.Mark != nil {
		if sl := s.m[req.ID]; tx != nil && !sl.marked {
			// The claim's mark rolls back with it (store.Settler).
			sl.marked, sl.prevMark = true, s.marks[req.ID]
		}
		s.putMark(req.ID, req.Token, *req.Mark)
	}
	// The claimed record's fingerprint is the request's: the caller gets
	// its own slice back, not the store's.
	out := *r
	out.Fingerprint = req.Fingerprint
	if len(out.Fingerprint) == 0 {
		out.Fingerprint = nil
	}
	return store.ClaimResult{Claimed: true, Record: out}, nil
}

// Extend implements [store.Store]. It cannot tell whether the record has
// expired (it is given no time); see the package documentation.
func (s *Store) Extend(ctx context.Context, id store.ID, token int64, leaseUntil time.Time) error {
	tx, err := s.txFrom(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := tx.check(); err != nil {
		return err
	}
	sl := s.m[id]
	cur, busy := sl.view(tx)
	if err := fenced(cur, busy, token); err != nil {
		return err
	}
	if cur.State != store.StateInProgress {
		return fmt.Errorf("%w: the record is %v", core.ErrFenced, cur.State)
	}
	r := *cur
	r.LeaseUntil = leaseUntil.UTC()
	if r.ExpiresAt.Before(leaseUntil) {
		r.ExpiresAt = r.LeaseUntil
	}
	return s.put(id, sl, tx, &r)
}

// Complete implements [store.Store]. It cannot tell whether the record has
// expired (it is given no time); see the package documentation.
func (s *Store) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	tx, err := s.txFrom(ctx)
	if err != nil {
		return err
	}
	if c.State != store.StateCompleted && c.State != store.StateIndeterminate {
		return fmt.Errorf("%w, not %v", errInvalidState, c.State)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := tx.check(); err != nil {
		return err
	}
	sl := s.m[id]
	cur, busy := sl.view(tx)
	if err := fenced(cur, busy, token); err != nil {
		return err
	}
	if cur.State == store.StateCompleted {
		return fmt.Errorf("%w: the record is already completed", core.ErrFenced)
	}
	r := *cur
	r.State = c.State
	r.Status = c.Status
	r.Response = cloneBytes(c.Response)
	r.ExpiresAt = c.ExpiresAt.UTC()
	r.LeaseUntil = time.Time{}
	return s.put(id, sl, tx, &r)
}

// Release implements [store.Store]. It cannot tell whether the record has
// expired (it is given no time); see the package documentation.
func (s *Store) Release(ctx context.Context, id store.ID, token int64) error {
	tx, err := s.txFrom(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := tx.check(); err != nil {
		return err
	}
	sl := s.m[id]
	cur, busy := sl.view(tx)
	if cur == nil && !busy {
		return nil
	}
	if err := fenced(cur, busy, token); err != nil {
		return err
	}
	if cur.State == store.StateCompleted {
		return fmt.Errorf("%w: a completed record is never released", core.ErrFenced)
	}
	return s.put(id, sl, tx, nil)
}

// Get implements [store.Store]. Outside a transaction, a record held by an
// open transaction reads as its committed value.
func (s *Store) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	tx, err := s.txFrom(ctx)
	if err != nil {
		return store.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := tx.check(); err != nil {
		return store.Record{}, err
	}
	cur, _ := s.m[id].view(tx)
	if cur == nil || !live(cur, now) {
		return store.Record{}, core.ErrNotFound
	}
	return clone(cur), nil
}

// DeleteExpired implements [store.Store]. It skips records held by another
// open transaction.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	tx, err := s.txFrom(ctx)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := tx.check(); err != nil {
		return 0, err
	}
	n := 0
	for id, sl := range s.m {
		if n == limit {
			break
		}
		cur, busy := sl.view(tx)
		if busy || cur == nil || live(cur, now) {
			continue
		}
		if err := s.put(id, sl, tx, nil); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// List implements [store.Inspector]: it looks at every record (memstore
// keeps no index). Outside a transaction, a record held by an open
// transaction is listed as its committed value.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	tx, err := s.txFrom(ctx)
	if err != nil {
		return nil, err
	}
	if err := q.Check(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := tx.check(); err != nil {
		return nil, err
	}
	var recs []*store.Record
	for _, sl := range s.m {
		r, _ := sl.view(tx)
		if r == nil || r.State != q.State || !live(r, q.Now) ||
			(!q.CreatedBefore.IsZero() && !r.CreatedAt.Before(q.CreatedBefore)) ||
			(!q.After.IsZero() && compareAt(r, q.After) <= 0) {
			continue
		}
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(a, b *store.Record) int { return compareAt(a, store.CursorOf(*b)) })
	if len(recs) > q.Limit {
		recs = recs[:q.Limit]
	}
	out := make([]store.Record, len(recs))
	for i, r := range recs {
		out[i] = *r
		out[i].Fingerprint = cloneBytes(r.Fingerprint)
		out[i].Response = nil
	}
	return out, nil
}

// compareAt compares r's position in List's order with c.
func compareAt(r *store.Record, c store.Cursor) int {
	if d := r.CreatedAt.Compare(c.CreatedAt); d != 0 {
		return d
	}
	return bytes.Compare(r.ID[:], c.ID[:])
}

// put stores r (nil: deletes the record) in the slot sl of id, which may be
// nil, on behalf of tx (nil: outside any transaction). s.mu must be held,
// and sl must not be held by another transaction.
func (s *Store) put(id store.ID, sl *slot, tx *memTx, r *store.Record) error {
	if tx == nil {
		switch {
		case r == nil:
			delete(s.m, id)
		case sl == nil:
			s.m[id] = &slot{rec: r}
		default:
			sl.rec = r
		}
		return nil
	}
	if sl == nil || sl.owner != tx {
		if err := tx.enlist(id); err != nil {
			return err
		}
		if sl == nil {
			sl = new(slot)
			s.m[id] = sl
		}
		sl.owner, sl.prev = tx, sl.rec
	}
	sl.rec = r
	return nil
}

// fenced returns an ErrFenced error unless cur is present, not held by
// another transaction, and owned by token.
func fenced(cur *store.Record, busy bool, token int64) error {
	switch {
	case busy:
		return fmt.Errorf("%w: the record is held by another open transaction", core.ErrFenced)
	case cur == nil:
		return fmt.Errorf("%w: the record is absent", core.ErrFenced)
	case cur.Token != token:
		return fmt.Errorf("%w: the record belongs to another attempt", core.ErrFenced)
	}
	return nil
}

func live(r *store.Record, now time.Time) bool { return r.ExpiresAt.After(now) }

// clone returns a copy of r that shares no memory with it.
func clone(r *store.Record) store.Record {
	c := *r
	c.Fingerprint, c.Response = cloneBoth(r.Fingerprint, r.Response)
	return c
}

// cloneBoth copies fp and resp into one allocation; nil and empty both
// become nil.
func cloneBoth(fp, resp []byte) (fpc, respc []byte) {
	nf, nr := len(fp), len(resp)
	if nf+nr == 0 {
		return nil, nil
	}
	b := make([]byte, nf+nr)
	if nf > 0 {
		fpc = b[:nf:nf]
		copy(fpc, fp)
	}
	if nr > 0 {
		respc = b[nf:]
		copy(respc, resp)
	}
	return fpc, respc
}

// cloneBytes copies b; nil and empty both become nil.
func cloneBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}
