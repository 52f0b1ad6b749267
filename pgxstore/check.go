package pgxstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/internal/pgsql"
)

// Check verifies, at start-up, that the store can work: the server is
// PostgreSQL 12 or later, and the table exists with the columns and the
// primary key the store needs. Call it after Migrate (or after your
// migration tool ran), before serving. A misconfiguration is an error
// wrapping core.ErrConfig whose text names the fix; a server that cannot
// be reached is an error wrapping core.ErrStoreUnavailable. Check writes
// nothing.
func (s *Store) Check(ctx context.Context) error {
	c, _, err := s.conn(ctx)
	if err != nil {
		return err
	}
	if err := s.checkServer(ctx, c); err != nil {
		return err
	}
	return s.checkTable(ctx, c)
}

// checkServer fails unless the server is PostgreSQL 12 or later.
func (s *Store) checkServer(ctx context.Context, c querier) error {
	var v string
	if err := c.QueryRow(ctx, `SELECT version()`).Scan(&v); err != nil {
		return unavailable("check: reading the server version", err)
	}
	if !strings.HasPrefix(v, "PostgreSQL ") {
		return fmt.Errorf("%w: pgxstore: the server is %q, not PostgreSQL (a server speaking its protocol): pgxstore needs PostgreSQL 12 or later", core.ErrConfig, v)
	}
	ver := strings.TrimSuffix(strings.Fields(v)[1], ",")
	major, _ := strconv.Atoi(strings.SplitN(ver, ".", 2)[0])
	if major != 0 && major < 12 {
		return fmt.Errorf("%w: pgxstore: the server is PostgreSQL %s; pgxstore needs PostgreSQL 12 or later", core.ErrConfig, ver)
	}
	return nil
}

// checkTable fails when the table is missing, lacks a column, or its
// primary key is not (id).
func (s *Store) checkTable(ctx context.Context, c querier) error {
	migrate := fmt.Sprintf("run store.Migrate(ctx), or apply sqlstore's migrations/postgres files for table %q with your migration tool", s.table)
	rows, err := c.Query(ctx, `SELECT * FROM `+s.table+` WHERE 1 = 0`)
	if err != nil {
		return fmt.Errorf("%w: pgxstore: table %q cannot be read (missing?): %s: %v", core.ErrConfig, s.table, migrate, err)
	}
	var have []string
	for _, f := range rows.FieldDescriptions() {
		have = append(have, strings.ToLower(f.Name))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%w: pgxstore: table %q cannot be read (missing?): %s: %v", core.ErrConfig, s.table, migrate, err)
	}
	var missing []string
	for _, col := range strings.Split(strings.ReplaceAll(pgsql.Cols, " ", ""), ",") {
		if !slices.Contains(have, col) {
			missing = append(missing, col)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: pgxstore: table %q lacks the column(s) %s that the store needs; migrate it to the schema of store.Schema(), or drop it and run store.Migrate(ctx)",
			core.ErrConfig, s.table, strings.Join(missing, ", "))
	}
	rows, err = c.Query(ctx, s.q.PrimaryKey, strings.ToLower(s.table))
	if err != nil {
		return unavailable("check: primary key", err)
	}
	var pk []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return unavailable("check: primary key", err)
		}
		pk = append(pk, strings.ToLower(name))
	}
	if err := rows.Err(); err != nil {
		return unavailable("check: primary key", err)
	}
	if !slices.Equal(pk, []string{"id"}) {
		return fmt.Errorf("%w: pgxstore: table %q has the primary key (%s), the store needs (id): without it duplicates are not detected; recreate it with store.Migrate(ctx)",
			core.ErrConfig, s.table, strings.Join(pk, ", "))
	}
	return nil
}
