package sqlstore

import (
	"context"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/storeutil"
)

var _ store.Inspector = (*Store)(nil)

// List implements store.Inspector: one SELECT of the live rows in q.State,
// ORDER BY created_at, id with LIMIT, without the response column. No
// index covers state or created_at (an index on state would be written by
// every completion, and on Postgres end the in-place updates that
// completions are; see docs/decisions.md), so the database reads the live
// rows of the table to answer: a query for an operator (idemctl,
// core.Engine.AdminHandler), not for the request path. It takes no lock
// and waits for none: a plain read under the connection's isolation
// level (on SQLite in WAL mode, as the README recommends, it waits for no
// writer either).
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	c, _, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	i, args := storeutil.ListArgs(q, s.d.timeArg)
	rows, err := c.QueryContext(ctx, s.q.list[i], args...)
	if err != nil {
		return nil, s.failure(ctx, "list", err)
	}
	defer rows.Close()
	recs := make([]store.Record, 0, min(q.Limit, 64))
	for rows.Next() {
		var rec store.Record
		if _, err := scanRecord(rows, &rec); err != nil {
			return nil, unavailable("list", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, s.failure(ctx, "list", err)
	}
	return recs, nil
}
