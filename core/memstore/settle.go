package memstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

var _ store.Settler = (*Store)(nil)

// mark is a stored store.Mark with the token it was written under.
type mark struct {
	token int64
	m     store.Mark
}

// Mark implements [store.Settler]. A mark written by Mark is not
// transactional: one written in a transaction that rolls back is stale
// (its record is absent) and Due deletes it. A claim's mark
// (store.ClaimRequest.Mark) rolls back with the claim: the mark it
// replaced is back.
func (s *Store) Mark(ctx context.Context, id store.ID, token int64, m store.Mark) error {
	if _, err := s.txFrom(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putMark(id, token, m)
	return nil
}

// restoreMark puts back m, the mark of id that a rolled-back claim
// replaced (nil: id had none); s.mu is held.
func (s *Store) restoreMark(id store.ID, m *mark) {
	if m == nil {
		delete(s.marks, id)
		return
	}
	s.marks[id] = m
}

// putMark writes the mark of id under token; s.mu is held.
func (s *Store) putMark(id store.ID, token int64, m store.Mark) {
	m.Request = cloneBytes(m.Request)
	m.After = m.After.UTC()
	if s.marks == nil {
		s.marks = make(map[store.ID]*mark)
	}
	s.marks[id] = &mark{token: token, m: m}
}

// Due implements [store.Settler]: it looks at every mark (memstore keeps
// no index). A mark whose record an open transaction holds is skipped:
// it is neither returned nor deleted.
func (s *Store) Due(ctx context.Context, now time.Time, limit int) ([]store.Pending, error) {
	if limit < 1 || limit > store.MaxListLimit {
		return nil, fmt.Errorf("%w: Due: limit %d is not between 1 and %d", core.ErrConfig, limit, store.MaxListLimit)
	}
	if _, err := s.txFrom(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Pending
	for id, mk := range s.marks {
		if mk.m.After.After(now) {
			continue
		}
		cur, busy := s.m[id].view(nil)
		if busy {
			continue
		}
		if cur == nil || !live(cur, now) || cur.Token != mk.token || cur.State == store.StateCompleted {
			delete(s.marks, id)
			continue
		}
		rec := clone(cur)
		rec.Response = nil
		m := mk.m
		m.Request = cloneBytes(m.Request)
		out = append(out, store.Pending{Record: rec, Mark: m})
	}
	slices.SortFunc(out, func(a, b store.Pending) int {
		if c := a.Mark.After.Compare(b.Mark.After); c != 0 {
			return c
		}
		return cmp.Compare(string(a.Record.ID[:]), string(b.Record.ID[:]))
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Visit implements [store.Settler].
func (s *Store) Visit(ctx context.Context, id store.ID, token int64, seen, next time.Time, tries int) (bool, error) {
	if _, err := s.txFrom(ctx); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	mk := s.marks[id]
	if mk == nil || mk.token != token || !mk.m.After.Equal(seen) {
		return false, nil
	}
	n := *mk
	n.m.After, n.m.Tries = next.UTC(), tries
	s.marks[id] = &n
	return true, nil
}
