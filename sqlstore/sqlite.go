package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/storeutil"
)

// SQLite serialises writers: a transaction that has written holds the
// database's write lock until it ends, and the claim is a write, so a claim
// (of any id) waits for every open write transaction, up to the
// connection's busy_timeout, and then sees what it committed; a claim that
// waits longer fails with ErrStoreUnavailable (SQLITE_BUSY). SQLite cannot
// probe for another transaction's uncommitted claim. Within one process,
// the store's registry (registry.go, consulted by Claim) answers a
// duplicate of an id held by one of its own open transactions at once,
// before it reaches the database. The claim is one upsert with RETURNING, which returns a row only
// when it inserted or took over; when it returns none, a SELECT reads the
// existing row.
func sqliteQueries(t string) queries {
	return queries{
		claim: `INSERT INTO ` + t + ` (` + cols + `)
VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, 1, ?7, ?8, ?9, 0, NULL)
ON CONFLICT (id) DO UPDATE SET
    caller = excluded.caller, scope = excluded.scope, idem_key = excluded.idem_key,
    fingerprint = excluded.fingerprint, state = 1, token = excluded.token,
    attempt = CASE WHEN ` + t + `.expires_at <= ?9 THEN 1 ELSE ` + t + `.attempt + 1 END,
    lease_until = excluded.lease_until, expires_at = excluded.expires_at,
    created_at = CASE WHEN ` + t + `.expires_at <= ?9 THEN excluded.created_at ELSE ` + t + `.created_at END,
    status = 0, response = NULL
WHERE ` + t + `.expires_at <= ?9
   OR (?10 AND ` + t + `.state = 1 AND ` + t + `.lease_until <= ?9)
RETURNING ` + cols,
		read:     `SELECT ` + cols + ` FROM ` + t + ` WHERE id = ?1`,
		get:      `SELECT ` + cols + ` FROM ` + t + ` WHERE id = ?1 AND expires_at > ?2`,
		complete: `UPDATE ` + t + ` SET state = ?1, status = ?2, response = ?3, expires_at = ?4, lease_until = NULL WHERE id = ?5 AND token = ?6 AND state IN (1, 3)`,
		extend:   `UPDATE ` + t + ` SET lease_until = ?1, expires_at = MAX(expires_at, ?2) WHERE id = ?3 AND token = ?4 AND state = 1`,
		release:  `DELETE FROM ` + t + ` WHERE id = ?1 AND token = ?2 AND state IN (1, 3)`,
		exists:   `SELECT 1 FROM ` + t + ` WHERE id = ?1`,
		deleteExpired: `DELETE FROM ` + t + ` WHERE rowid IN (
    SELECT rowid FROM ` + t + ` WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2
)`,
	}
}

func (s *Store) claimSQLite(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return store.ClaimResult{}, err
	}
	if !inTx {
		// Leased mode: a replay or a running lease is answered by a read,
		// without taking the database's write lock. (In a transaction the
		// write comes first: a deferred transaction that read first could
		// fail with SQLITE_BUSY when it then writes.)
		if res, ok, err := s.readExisting(ctx, c, req); err != nil || ok {
			return res, err
		}
		if req.Mark != nil {
			return s.claimSQLiteMarked(ctx, req)
		}
	}
	res, err := s.claimSQLiteOn(ctx, c, req)
	return res, s.claimMark(ctx, c, req, res, err)
}

// claimSQLiteMarked runs a leased claim that carries a mark in a short
// transaction of its own, so the record and its mark commit together.
func (s *Store) claimSQLiteMarked(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	c, tx, err := beginPinned(ctx, s.db, s.txOpts)
	if err != nil {
		return store.ClaimResult{}, unavailable("claim: begin", err)
	}
	res, err := s.claimSQLiteOn(ctx, c, req)
	if err = s.claimMark(ctx, c, req, res, err); err != nil {
		_ = tx.Rollback()
		return store.ClaimResult{}, err
	}
	if err := tx.Commit(); err != nil {
		return store.ClaimResult{}, unavailable("claim: commit", err)
	}
	return res, nil
}

// claimSQLiteOn runs the claim's upsert on c (and, when it claims
// nothing, reads the row it met).
func (s *Store) claimSQLiteOn(ctx context.Context, c Conn, req store.ClaimRequest) (store.ClaimResult, error) {
	takeover := 0
	if req.Takeover {
		takeover = 1
	}
	for try := 0; ; try++ {
		var rec store.Record
		_, err := scanRecord(c.QueryRowContext(ctx, s.q.claim, req.ID[:], req.Caller, req.Scope, req.Key,
			storeutil.NullBytes(req.Fingerprint), req.Token, s.d.timeArg(req.LeaseUntil), s.d.timeArg(req.ExpiresAt),
			s.d.timeArg(req.Now), takeover), &rec)
		switch {
		case err == nil:
			return store.ClaimResult{Claimed: true, Record: rec}, nil
		case !errors.Is(err, sql.ErrNoRows):
			return store.ClaimResult{}, unavailable("claim", err)
		}
		// Not claimed: the row exists and is live. In a transaction we hold
		// the write lock, so it cannot change before this read; outside one
		// it may have been released or swept meanwhile: claim again.
		if res, ok, err := s.readExisting(ctx, c, req); err != nil || ok {
			return res, err
		}
		if try+1 == maxClaimTries {
			return storeutil.InProgressElsewhere(req.ID), nil
		}
	}
}
