package pgxstore

import (
	"context"
	"strconv"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/storeutil"
)

var _ store.Inspector = (*Store)(nil)

// List implements store.Inspector: one SELECT of the live rows in q.State,
// ORDER BY created_at, id with LIMIT, without the response column (the
// statement sqlstore runs on Postgres). No index covers state or
// created_at (see sqlstore.Store.List), so Postgres reads the live rows
// to answer: an operator's query, not the request path's. It takes no
// lock and waits for none.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	c, _, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	i, args := storeutil.ListArgs(q, timeArg)
	rows, err := c.Query(ctx, s.list[i], args...)
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

// listStatements are List's statements on table t.
func listStatements(t string) [4]string {
	return storeutil.ListStatements(t, func(n int) string { return "$" + strconv.Itoa(n) })
}
