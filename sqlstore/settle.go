package sqlstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/storeutil"
)

var _ store.Settler = (*Store)(nil)

// flavor is the dialect's flavor of the shared marks statements.
func (d Dialect) flavor() storeutil.Flavor {
	switch d {
	case Postgres:
		return storeutil.Postgres
	case MySQL:
		return storeutil.MySQL
	}
	return storeutil.SQLite
}

// MarksSchema returns the DDL that creates the marks table of table
// (store.Settler: "<table>_marks", the completer's) and its index, as
// migrations/<dialect>/0002_idempotency_marks.up.sql holds it for the
// default table. Migrate creates it with the records table. A deployment
// that does not name routes for the completer (core.Name) writes nothing
// to it.
func MarksSchema(d Dialect, table string) string {
	return strings.Join(storeutil.MarksSchema(table, d.flavor()), ";\n\n") + ";\n"
}

// dropMarks is the down migration of MarksSchema.
func dropMarks(table string) string {
	return "DROP TABLE IF EXISTS " + storeutil.MarksTable(table) + ";\n"
}

// markFailure is the error of a marks statement: the table may be
// missing (a table migrated before the completer: run Migrate, or the
// 0002 migration).
func (s *Store) markFailure(ctx context.Context, op string, err error) error {
	return s.failure(ctx, fmt.Sprintf("%s (is table %s there? Migrate creates it, or migrations/%s/0002_idempotency_marks.up.sql)",
		op, storeutil.MarksTable(s.table), s.d), err)
}

// Mark implements store.Settler: one upsert into the marks table, in the
// transaction ctx carries, else on its own. The engine's claims write
// their marks themselves (store.ClaimRequest.Mark): on Postgres in the
// claim's statement, on MySQL/MariaDB and SQLite in its transaction.
func (s *Store) Mark(ctx context.Context, id store.ID, token int64, m store.Mark) error {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return err
	}
	if _, err := s.exec(ctx, c, inTx, s.mq.Mark, id[:], token, m.Route, storeutil.NullBytes(m.Request), s.d.timeArg(m.After), m.Tries); err != nil {
		return s.markFailure(ctx, "mark", err)
	}
	return nil
}

// markArgs appends the parameters of m, a marked claim's mark
// (store.ClaimRequest.Mark), to the claim's args: Postgres's marked
// statements take them after the claim's. A nil m adds nothing.
func (s *Store) markArgs(args []any, m *store.Mark) []any {
	if m == nil {
		return args
	}
	return append(args, m.Route, storeutil.NullBytes(m.Request), s.d.timeArg(m.After), m.Tries)
}

// claimFailure is the error of a Postgres claim statement: a marked one
// (req.Mark) writes the marks table too, which may be missing.
func (s *Store) claimFailure(ctx context.Context, req store.ClaimRequest, err error) error {
	if req.Mark != nil {
		return s.markFailure(ctx, "claim", err)
	}
	return s.failure(ctx, "claim", err)
}

// claimMark writes the mark of a claim that claimed (res, err: the
// claim's answer) on c, the claim's transaction, and returns err, or the
// mark's error (MySQL, SQLite: the claim and its mark commit together;
// Postgres writes the mark in the claim's statement). A claim without a
// mark, or one that did not claim, writes nothing.
func (s *Store) claimMark(ctx context.Context, c Conn, req store.ClaimRequest, res store.ClaimResult, err error) error {
	if err != nil || !res.Claimed || req.Mark == nil {
		return err
	}
	m := req.Mark
	if _, err := c.ExecContext(ctx, s.mq.Mark, req.ID[:], req.Token, m.Route, storeutil.NullBytes(m.Request), s.d.timeArg(m.After), m.Tries); err != nil {
		return s.markFailure(ctx, "claim: mark", err)
	}
	return nil
}

// Due implements store.Settler: a range read of the marks table's due_at
// index, joined to the records by id, without locks. The stale marks it
// meets are deleted afterwards in a short transaction of their own that
// skips marks another transaction holds (FOR UPDATE SKIP LOCKED; SQLite:
// a plain DELETE); a failure to delete them is not an error (the next
// call tries again).
func (s *Store) Due(ctx context.Context, now time.Time, limit int) ([]store.Pending, error) {
	if limit < 1 || limit > store.MaxListLimit {
		return nil, fmt.Errorf("%w: Due: limit %d is not between 1 and %d", core.ErrConfig, limit, store.MaxListLimit)
	}
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := c.QueryContext(ctx, s.mq.Due, s.d.timeArg(now), limit)
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
			tries int64
		)
		found, err := scanRecord(rows, &p.Record, &mid, &token, &p.Mark.Route, &p.Mark.Request, dbTime{&p.Mark.After}, &tries)
		if err != nil {
			rows.Close()
			return nil, unavailable("due", err)
		}
		p.Mark.Tries = int(tries)
		if storeutil.StaleMark(found, p.Record, token, now) {
			staleArgs = append(staleArgs, mid, token, s.d.timeArg(p.Mark.After))
			continue
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return nil, s.failure(ctx, "due", err)
	}
	rows.Close()
	if len(staleArgs) > 0 {
		if err := s.deleteStale(ctx, c, inTx, staleArgs); err != nil && ctx.Err() != nil {
			return nil, unavailable("due", err)
		}
	}
	return out, nil
}

// deleteStale deletes the stale marks (storeutil's DeleteStale), in the
// transaction ctx carries or a short one of its own (SQLite: none).
func (s *Store) deleteStale(ctx context.Context, c Conn, inTx bool, args []any) error {
	run := func(c Conn) error {
		return s.mq.DeleteStale(args, func(q string, args []any) ([]any, error) {
			rows, err := c.QueryContext(ctx, q, args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return storeutil.IDs(rows)
		}, func(q string, args []any) error {
			_, err := c.ExecContext(ctx, q, args...)
			return err
		})
	}
	if inTx || s.d == SQLite {
		return run(c)
	}
	tx, err := s.db.BeginTx(ctx, s.txOpts)
	if err != nil {
		return err
	}
	if err := run(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Visit implements store.Settler: one UPDATE that compares the token and
// the due_at it was read with.
func (s *Store) Visit(ctx context.Context, id store.ID, token int64, seen, next time.Time, tries int) (bool, error) {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return false, err
	}
	res, err := s.exec(ctx, c, inTx, s.mq.Visit, s.d.timeArg(next), tries, id[:], token, s.d.timeArg(seen))
	if err != nil {
		return false, s.markFailure(ctx, "visit", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, unavailable("rows affected", err)
	}
	return n == 1, nil
}
