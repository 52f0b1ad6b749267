package pgxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/storeutil"
)

var _ store.Settler = (*Store)(nil)

// markFailure is the error of a marks statement: the table may be
// missing (a table migrated before the completer: run Migrate, or
// sqlstore's migrations/postgres/0002_idempotency_marks.up.sql).
func (s *Store) markFailure(ctx context.Context, op string, err error) error {
	return s.failure(ctx, fmt.Sprintf("%s (is table %s there? Migrate creates it, or sqlstore's migrations/postgres/0002_idempotency_marks.up.sql)",
		op, storeutil.MarksTable(s.table)), err)
}

// claimFailure is the error of a claim statement: a marked one
// (req.Mark) writes the marks table too, which may be missing.
func (s *Store) claimFailure(ctx context.Context, req store.ClaimRequest, err error) error {
	if req.Mark != nil {
		return s.markFailure(ctx, "claim", err)
	}
	return s.failure(ctx, "claim", err)
}

// Mark implements store.Settler with sqlstore's statement (the marks
// table both stores share): one upsert, in the transaction ctx carries,
// else on its own. The engine's claims write their marks in the claim's
// own statement (store.ClaimRequest.Mark, internal/pgsql).
func (s *Store) Mark(ctx context.Context, id store.ID, token int64, m store.Mark) error {
	c, _, err := s.conn(ctx)
	if err != nil {
		return err
	}
	if _, err := c.Exec(ctx, s.mq.Mark, id[:], token, m.Route, storeutil.NullBytes(m.Request), timeArg(m.After), int32(m.Tries)); err != nil {
		return s.markFailure(ctx, "mark", err)
	}
	return nil
}

// Due implements store.Settler as sqlstore's does: a range read of the
// marks' due_at index joined to the records, without locks; the stale
// marks it meets are deleted afterwards in a short transaction that
// skips marks another transaction holds (storeutil's DeleteStale); a
// failure to delete them is not an error (the next call tries again).
func (s *Store) Due(ctx context.Context, now time.Time, limit int) ([]store.Pending, error) {
	if limit < 1 || limit > store.MaxListLimit {
		return nil, fmt.Errorf("%w: Due: limit %d is not between 1 and %d", core.ErrConfig, limit, store.MaxListLimit)
	}
	c, _, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := c.Query(ctx, s.mq.Due, timeArg(now), limit)
	if err != nil {
		return nil, s.markFailure(ctx, "due", err)
	}
	var (
		out       []store.Pending
		staleArgs []any
	)
	for rows.Next() {
		var (
			p     store.Pending
			mid   []byte
			token int64
			tries int32
		)
		found, err := scanRecord(rows, &p.Record, &mid, &token, &p.Mark.Route, &p.Mark.Request, &p.Mark.After, &tries)
		if err != nil {
			rows.Close()
			return nil, unavailable("due", err)
		}
		p.Mark.After = p.Mark.After.UTC()
		p.Mark.Tries = int(tries)
		if storeutil.StaleMark(found, p.Record, token, now) {
			staleArgs = append(staleArgs, mid, token, timeArg(p.Mark.After))
			continue
		}
		out = append(out, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, s.failure(ctx, "due", err)
	}
	if len(staleArgs) > 0 {
		err := s.inShortTx(ctx, func(c querier) error {
			return s.mq.DeleteStale(staleArgs, func(q string, args []any) ([]any, error) {
				rows, err := c.Query(ctx, q, args...)
				if err != nil {
					return nil, err
				}
				defer rows.Close()
				return storeutil.IDs(rows)
			}, func(q string, args []any) error {
				_, err := c.Exec(ctx, q, args...)
				return err
			})
		})
		if err != nil && ctx.Err() != nil {
			return nil, unavailable("due", err)
		}
	}
	return out, nil
}

// Visit implements store.Settler: one UPDATE that compares the token and
// the due_at it was read with.
func (s *Store) Visit(ctx context.Context, id store.ID, token int64, seen, next time.Time, tries int) (bool, error) {
	c, _, err := s.conn(ctx)
	if err != nil {
		return false, err
	}
	tag, err := c.Exec(ctx, s.mq.Visit, timeArg(next), int32(tries), id[:], token, timeArg(seen))
	if err != nil {
		return false, s.markFailure(ctx, "visit", err)
	}
	return tag.RowsAffected() == 1, nil
}
