package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/pgsql"
	"github.com/idemkit/idem/internal/storeutil"
)

// Postgres: the statements are idem's shared Postgres SQL (internal/pgsql),
// which pgxstore runs too, so both stores share one table. A claim of an
// id never seen is one INSERT whose non-blocking probe,
// pg_try_advisory_xact_lock on a 64-bit key derived from the id (and the
// table name), rides in its WHERE; outside a transaction (leased mode)
// the lock is taken in shared mode. When it inserts nothing the row is
// there or another transaction holds the id: a read answers a replay,
// and the full claim statement (the probe and INSERT ... ON CONFLICT DO
// UPDATE) the rest. A claim that carries a mark (store.ClaimRequest.Mark)
// runs the marked form of the same statement, which upserts the mark in
// a CTE: still one statement. See internal/pgsql for the details.
func postgresQueries(t string) queries {
	q := pgsql.New(t)
	return queries{
		insert:        q.Insert,
		insertLeased:  q.InsertLeased,
		claim:         q.Claim,
		claimLeased:   q.ClaimLeased,
		marked:        [4]string{q.InsertMarked, q.InsertLeasedMarked, q.ClaimMarked, q.ClaimLeasedMarked},
		read:          q.Read,
		get:           q.Get,
		complete:      q.Complete,
		extend:        q.Extend,
		release:       q.Release,
		exists:        q.Exists,
		deleteExpired: q.DeleteExpired,
	}
}

func (s *Store) lockKey(id store.ID) int64 {
	return pgsql.LockKey(id, s.lock)
}

// claimPostgres claims req. At REPEATABLE READ or SERIALIZABLE a claim
// that meets a row committed after its transaction's snapshot fails with
// a serialization failure (40001): when the claim began the transaction
// (Begin's, nothing else ran in it), the transaction is begun again and
// the claim runs again, with a snapshot that shows the row.
func (s *Store) claimPostgres(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	l, _ := ctx.Value(connKey{}).(*lazyTx)
	fresh := l != nil && !l.started()
	for try := 1; ; try++ {
		res, err := s.claimPostgresOnce(ctx, req)
		if err == nil || !fresh || try == maxClaimTries || !serializationFailure(err) || !l.restart() {
			return res, err
		}
	}
}

// serializationFailure reports whether err is Postgres's SQLSTATE 40001.
func serializationFailure(err error) bool {
	var st interface{ SQLState() string } // pgconn.PgError, pq.Error
	return errors.As(err, &st) && st.SQLState() == "40001"
}

func (s *Store) claimPostgresOnce(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return store.ClaimResult{}, err
	}
	// The common path: an id never seen, one INSERT (with its mark).
	q := s.q.insert
	switch {
	case req.Mark != nil && inTx:
		q = s.q.marked[0]
	case req.Mark != nil:
		q = s.q.marked[1]
	case !inTx:
		q = s.q.insertLeased
	}
	args := []any{s.lockKey(req.ID), req.ID[:], req.Caller, req.Scope, req.Key,
		storeutil.NullBytes(req.Fingerprint), req.Token, s.d.timeArg(req.LeaseUntil), s.d.timeArg(req.ExpiresAt), s.d.timeArg(req.Now)}
	res, err := c.ExecContext(ctx, q, s.markArgs(args, req.Mark)...)
	if err != nil {
		return store.ClaimResult{}, s.claimFailure(ctx, req, err)
	}
	switch n, err := res.RowsAffected(); {
	case err != nil:
		return store.ClaimResult{}, unavailable("rows affected", err)
	case n == 1:
		return store.ClaimResult{Claimed: true, Record: storeutil.NewRecord(req)}, nil
	}
	// The row is there, or another transaction holds the id: a read
	// answers a replay or a live lease. A claimable row, no row (another
	// transaction holds the id's lock and has not committed its row; or a
	// sweep or a release deleted the row after the INSERT saw it: nothing
	// holds the id) go to the full claim statement.
	var rec store.Record
	found, err := scanRecord(c.QueryRowContext(ctx, s.q.read, req.ID[:]), &rec)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return store.ClaimResult{}, s.failure(ctx, "claim read", err)
	case found && storeutil.Live(rec, req.Now) && !storeutil.Takeable(rec, req):
		if l, ok := ctx.Value(connKey{}).(*lazyTx); ok && rec.State == store.StateCompleted {
			l.replayed() // its transaction may end off the caller's path
		}
		return store.ClaimResult{Record: rec}, nil
	}
	return s.claimPostgresExisting(ctx, c, inTx, req)
}

// claimPostgresExisting is the claim of an id whose row is there but
// claimable (expired, a lapsed lease), which another transaction holds,
// or whose row was deleted after the INSERT saw it: the full claim
// statement, which takes the lock only when no live row answers, inserts
// a missing row, and replaces a claimable one with ON CONFLICT DO UPDATE;
// at most maxClaimTries times.
func (s *Store) claimPostgresExisting(ctx context.Context, c Conn, inTx bool, req store.ClaimRequest) (store.ClaimResult, error) {
	for try := 0; ; try++ {
		var (
			ok, inserted bool
			rec          store.Record
		)
		args := []any{s.lockKey(req.ID), req.ID[:], req.Caller, req.Scope, req.Key,
			storeutil.NullBytes(req.Fingerprint), req.Token, s.d.timeArg(req.LeaseUntil), s.d.timeArg(req.ExpiresAt),
			s.d.timeArg(req.Now), req.Takeover}
		q := s.q.claim
		switch {
		case req.Mark != nil && inTx:
			q = s.q.marked[2]
		case req.Mark != nil:
			q = s.q.marked[3]
		case !inTx:
			q = s.q.claimLeased
		}
		found, err := scanRecord(c.QueryRowContext(ctx, q, s.markArgs(args, req.Mark)...), &rec, &ok, &inserted)
		if err != nil {
			return store.ClaimResult{}, s.claimFailure(ctx, req, err)
		}
		switch {
		case inserted:
			return store.ClaimResult{Claimed: true, Record: rec}, nil
		case !ok && (!found || !storeutil.Live(rec, req.Now) || storeutil.Takeable(rec, req)):
			// Another transaction holds the identity and is creating,
			// replacing or taking over the record.
			return storeutil.InProgressElsewhere(req.ID), nil
		case found && storeutil.Live(rec, req.Now) && !(ok && storeutil.Takeable(rec, req)):
			// Completed, indeterminate, or held by a live lease: the record
			// as it is (a completed record is final, so reading it past
			// another holder of the lock is safe).
			return store.ClaimResult{Record: rec}, nil
		}
		// We held the lock but ON CONFLICT met a row our snapshot does not
		// show (committed between the snapshot and the lock): run again
		// with a new snapshot (READ COMMITTED).
		if try+1 == maxClaimTries {
			return storeutil.InProgressElsewhere(req.ID), nil
		}
	}
}
