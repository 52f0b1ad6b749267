package sqlstore

import (
	"context"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/internal/pgsql"
)

// Postgres: the statements are idem's shared Postgres SQL (internal/pgsql),
// which pgxstore runs too, so both stores share one table. The claim is one
// statement: pg_try_advisory_xact_lock on a 64-bit key derived from the id
// (and the table name) is the non-blocking probe, and only the transaction
// that holds the lock goes on to INSERT ... ON CONFLICT; outside a
// transaction (leased mode) the lock is taken in shared mode. See
// internal/pgsql for the details.
func postgresQueries(t string) queries {
	q := pgsql.New(t)
	return queries{
		claim:         q.Claim,
		claimLeased:   q.ClaimLeased,
		read:          q.Read,
		get:           q.Get,
		complete:      q.Complete,
		extend:        q.Extend,
		release:       q.Release,
		exists:        q.Exists,
		deleteExpired: q.DeleteExpired,
	}
}

func (s *Store) lockKey(id core.ID) int64 {
	return pgsql.LockKey(id, s.lock)
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
