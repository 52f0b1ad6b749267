package sqlstore

import (
	"context"
	"encoding/binary"
	"strings"

	"github.com/idemkit/idem/core"
)

// Postgres: the claim is one statement. pg_try_advisory_xact_lock on a
// 64-bit key derived from the id (and the table name) is the non-blocking
// probe: only the transaction that holds the lock goes on to
// INSERT ... ON CONFLICT, so ON CONFLICT never waits for another claimer's
// uncommitted row. The lock is transaction-scoped: in atomic mode it is held
// until the business transaction ends; in leased mode (autocommit) until the
// statement's implicit transaction commits. The last SELECT returns the
// inserted or taken-over row, or else the existing row as the statement's
// snapshot sees it (a data-modifying CTE's output is visible, its effects
// are not).
//
// Outside a transaction (leased mode) the claim takes the lock in shared
// mode (pg_try_advisory_xact_lock_shared): leased claims of one id do not
// exclude each other (ON CONFLICT settles their race, each waiting at most
// for another leased claim's one-statement transaction), but they fail at
// once while a transaction in atomic mode holds the exclusive lock, and an
// atomic claim fails at once while a leased claim is running.
func postgresQueries(t string) queries {
	const (
		exclusive = `pg_try_advisory_xact_lock($1::bigint)`
		shared    = `pg_try_advisory_xact_lock_shared($1::bigint)`
	)
	claim := `WITH lk AS MATERIALIZED (
    SELECT %s AS ok
), ins AS (
    INSERT INTO ` + t + ` AS r (` + cols + `)
    SELECT $2::bytea, $3::varchar, $4::varchar, $5::varchar, $6::bytea, 1::smallint, $7::bigint, 1,
           $8::timestamptz, $9::timestamptz, $10::timestamptz, 0, NULL::bytea
      FROM lk WHERE lk.ok
    ON CONFLICT (id) DO UPDATE SET
        caller = EXCLUDED.caller, scope = EXCLUDED.scope, idem_key = EXCLUDED.idem_key,
        fingerprint = EXCLUDED.fingerprint, state = 1, token = EXCLUDED.token,
        attempt = CASE WHEN r.expires_at <= $10 THEN 1 ELSE r.attempt + 1 END,
        lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at,
        created_at = CASE WHEN r.expires_at <= $10 THEN EXCLUDED.created_at ELSE r.created_at END,
        status = 0, response = NULL
    WHERE r.expires_at <= $10
       OR ($11::boolean AND r.state = 1 AND r.lease_until <= $10)
    RETURNING r.id, r.caller, r.scope, r.idem_key, r.fingerprint, r.state, r.token, r.attempt,
              r.lease_until, r.expires_at, r.created_at, r.status, r.response
)
SELECT lk.ok, TRUE, ins.* FROM lk CROSS JOIN ins
UNION ALL
SELECT lk.ok, FALSE, r.id, r.caller, r.scope, r.idem_key, r.fingerprint, r.state, r.token, r.attempt,
       r.lease_until, r.expires_at, r.created_at, r.status, r.response
  FROM lk LEFT JOIN ` + t + ` r ON r.id = $2
 WHERE NOT EXISTS (SELECT FROM ins)`
	return queries{
		claim:       strings.Replace(claim, "%s", exclusive, 1),
		claimLeased: strings.Replace(claim, "%s", shared, 1),
		read:        `SELECT ` + cols + ` FROM ` + t + ` WHERE id = $1`,
		get:         `SELECT ` + cols + ` FROM ` + t + ` WHERE id = $1 AND expires_at > $2`,
		complete:    `UPDATE ` + t + ` SET state = $1, status = $2, response = $3, expires_at = $4, lease_until = NULL WHERE id = $5 AND token = $6 AND state IN (1, 3)`,
		extend:      `UPDATE ` + t + ` SET lease_until = $1, expires_at = GREATEST(expires_at, $2) WHERE id = $3 AND token = $4 AND state = 1`,
		release:     `DELETE FROM ` + t + ` WHERE id = $1 AND token = $2 AND state IN (1, 3)`,
		exists:      `SELECT 1 FROM ` + t + ` WHERE id = $1`,
		// The batch is locked through the expires_at index and deleted by
		// ctid (a TID scan of the locked rows). The earlier form,
		// "WHERE id IN (SELECT id ... FOR UPDATE SKIP LOCKED)", got a generic
		// plan after five executions of the cached statement (pgx caches
		// them), a hash semi-join that read every expired row for each
		// batch: 1,000 rows/s on a table of a million expired records.
		deleteExpired: `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + t + ` WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED
)) AND expires_at <= $1`,
	}
}

func (s *Store) lockKey(id core.ID) int64 {
	return int64(binary.BigEndian.Uint64(id[:8]) ^ s.lock)
}

func (s *Store) claimPostgres(ctx context.Context, req core.ClaimRequest) (core.ClaimResult, error) {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return core.ClaimResult{}, err
	}
	for try := 0; ; try++ {
		var (
			ok, inserted bool
			rec          core.Record
		)
		args := []any{s.lockKey(req.ID), req.ID[:], req.Caller, req.Scope, req.Key,
			nullBytes(req.Fingerprint), req.Token, s.d.timeArg(req.LeaseUntil), s.d.timeArg(req.ExpiresAt),
			s.d.timeArg(req.Now), req.Takeover}
		q := s.q.claim
		if !inTx {
			q = s.q.claimLeased
		}
		found, err := scanRecord(c.QueryRowContext(ctx, q, args...), &rec, &ok, &inserted)
		if err != nil {
			return core.ClaimResult{}, s.failure(ctx, "claim", err)
		}
		switch {
		case inserted:
			return core.ClaimResult{Claimed: true, Record: rec}, nil
		case !ok && (!found || !live(rec, req.Now) || takeable(rec, req)):
			// Another transaction holds the identity and is creating,
			// replacing or taking over the record.
			return inProgressElsewhere(req.ID), nil
		case found && live(rec, req.Now) && !(ok && takeable(rec, req)):
			// Completed, indeterminate, or held by a live lease: the record
			// as it is (a completed record is final, so reading it past
			// another holder of the lock is safe).
			return core.ClaimResult{Record: rec}, nil
		}
		// We held the lock but ON CONFLICT met a row our snapshot does not
		// show (committed between the snapshot and the lock): run again
		// with a new snapshot (READ COMMITTED).
		if try+1 == maxClaimTries {
			return inProgressElsewhere(req.ID), nil
		}
	}
}
