package sqlstore

import (
	"context"
	"time"

	"github.com/idemkit/idem/core/syncclock"
)

var _ syncclock.TimeSource = (*Store)(nil)

// Now reads the database's clock (syncclock.TimeSource), so that processes whose
// wall clocks drift agree on leases and expiry: pass it to
// syncclock.New and the synced clock to core.WithClock. SQLite's
// clock is the host's, which every process on one file shares anyway.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var q string
	switch s.d {
	case Postgres:
		q = `SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)`
	case MySQL:
		q = `SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)`
	default:
		q = `SELECT CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)`
	}
	c, _, err := s.conn(context.WithoutCancel(ctx))
	if err != nil {
		return time.Time{}, err
	}
	var us int64
	if err := c.QueryRowContext(ctx, q).Scan(&us); err != nil {
		return time.Time{}, unavailable("now", err)
	}
	return time.UnixMicro(us).UTC(), nil
}
