// Package storeutil holds what the SQL stores (sqlstore, pgxstore) check
// and write the same way: table names, the statements of an operator's
// listing (store.Inspector) and of the completer's marks, and the claim's
// helpers (the record a claim writes, whether a row is live or may be
// taken over, column values). The record's debug strings are cleaned by
// internal/debugtext, which the engine uses too.
package storeutil

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// RollbackTimeout bounds a ROLLBACK that runs after the request's
// answer (a replay's transaction, ended off the caller's path): one that
// hangs on a dead connection is cut short, and the connection closed.
const RollbackTimeout = 5 * time.Second

// MaxTableLen keeps "<table>_expires_at_idx" within Postgres' 63-byte
// identifier limit.
const MaxTableLen = 48

// ValidTable checks a table name for pkg's WithTable ("sqlstore",
// "pgxstore"): 1 to MaxTableLen bytes of ASCII letters, digits and
// underscores, not starting with a digit (it is used unquoted). The error
// wraps core.ErrConfig.
func ValidTable(pkg, name string) error {
	if name == "" || len(name) > MaxTableLen {
		return fmt.Errorf("%w: %s: table name must be 1 to %d bytes, got %q", core.ErrConfig, pkg, MaxTableLen, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return fmt.Errorf("%w: %s: table name %q: only letters, digits and underscores, not starting with a digit", core.ErrConfig, pkg, name)
		}
	}
	return nil
}

// ListCols is the column list of store.Inspector's List, in the stores'
// scan order: every column but the response, which List does not read
// (NULL in its place).
const ListCols = `id, caller, scope, idem_key, fingerprint, state, token, attempt, lease_until, expires_at, created_at, status, NULL`

// ListStatements returns the four forms of List on table t, with
// placeholders written by ph (1-based): index 0 plain, +1 with a
// CreatedBefore bound, +2 with a cursor. Their parameters, in order:
// state, now, [created before], [cursor created_at, cursor created_at,
// cursor id], limit. No index covers state (an index on it would be
// rewritten by every completion; see docs/decisions.md), so the database
// reads the live rows to answer: an operator's query, not the request
// path's.
func ListStatements(t string, ph func(n int) string) [4]string {
	var out [4]string
	for i := range out {
		n := 0
		next := func() string { n++; return ph(n) }
		var b strings.Builder
		b.WriteString(`SELECT ` + ListCols + ` FROM ` + t + ` WHERE state = ` + next() + ` AND expires_at > ` + next())
		if i&1 != 0 {
			b.WriteString(` AND created_at < ` + next())
		}
		if i&2 != 0 {
			b.WriteString(` AND (created_at > ` + next() + ` OR (created_at = ` + next() + ` AND id > ` + next() + `))`)
		}
		b.WriteString(` ORDER BY created_at, id LIMIT ` + next())
		out[i] = b.String()
	}
	return out
}

// ListArgs returns the statement index of ListStatements for q and its
// arguments, with times converted by timeArg.
func ListArgs(q store.ListQuery, timeArg func(time.Time) any) (int, []any) {
	i := 0
	args := []any{int16(q.State), timeArg(q.Now)}
	if !q.CreatedBefore.IsZero() {
		i |= 1
		args = append(args, timeArg(q.CreatedBefore))
	}
	if !q.After.IsZero() {
		i |= 2
		ca := timeArg(q.After.CreatedAt)
		args = append(args, ca, ca, q.After.ID[:])
	}
	return i, append(args, q.Limit)
}
