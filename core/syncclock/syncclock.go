// Package syncclock gives every process that shares a store one clock to
// decide leases and expiry by: the database's, followed through an offset
// (see Clock). Pass a Clock's Now to core.WithClock.
package syncclock

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/idem/core"
)

// TimeSource reads a clock that every process sharing a store agrees on:
// the database's. The SQL stores implement it.
type TimeSource interface {
	Now(ctx context.Context) (time.Time, error)
}

// Clock is a clock that follows a TimeSource without asking it on
// every request: it samples the source every so often, keeps the offset
// between the source and the local clock (corrected by half the round trip
// of the sample), and answers local time plus that offset. Processes whose
// wall clocks differ by seconds then agree on lease and expiry decisions
// within a few milliseconds (the round trip of a sample), because each
// reads the database's clock through its own offset. Pass its Now to
// core.WithClock.
type Clock struct {
	src   TimeSource
	local func() time.Time

	mu     sync.RWMutex
	offset time.Duration
	rtt    time.Duration

	stop chan struct{}
	done chan struct{}
}

// DefaultEvery is how often a Clock samples its source.
const DefaultEvery = 10 * time.Second

// New samples src once (failing if it cannot) and then every
// `every` (DefaultEvery when zero) in the background until Stop.
// Failed samples keep the last offset and are logged.
func New(ctx context.Context, src TimeSource, every time.Duration) (*Clock, error) {
	return newClock(ctx, src, every, time.Now)
}

func newClock(ctx context.Context, src TimeSource, every time.Duration, local func() time.Time) (*Clock, error) {
	if every <= 0 {
		every = DefaultEvery
	}
	c := &Clock{src: src, local: local, stop: make(chan struct{}), done: make(chan struct{})}
	if err := c.Sync(ctx); err != nil {
		return nil, err
	}
	go func() {
		defer close(c.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-t.C:
				sctx, cancel := context.WithTimeout(context.Background(), every)
				if err := c.Sync(sctx); err != nil {
					slog.Warn("idempotency: syncing the clock with the database failed; keeping the last offset", slog.String("error", err.Error()))
				}
				cancel()
			}
		}
	}()
	return c, nil
}

// Sync samples the source now.
func (c *Clock) Sync(ctx context.Context) error {
	before := c.local()
	remote, err := c.src.Now(ctx)
	after := c.local()
	if err != nil {
		return fmt.Errorf("%w: reading the database clock: %w", core.ErrStoreUnavailable, err)
	}
	rtt := after.Sub(before)
	mid := before.Add(rtt / 2)
	c.mu.Lock()
	c.offset, c.rtt = remote.Sub(mid), rtt
	c.mu.Unlock()
	return nil
}

// Now returns the source's time, estimated from the local clock.
func (c *Clock) Now() time.Time {
	c.mu.RLock()
	off := c.offset
	c.mu.RUnlock()
	return c.local().Add(off)
}

// Offset reports the last measured offset of the source from the local
// clock, and the round trip of that sample (the bound on its error).
func (c *Clock) Offset() (offset, uncertainty time.Duration) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.offset, c.rtt / 2
}

// Stop ends the background sampling.
func (c *Clock) Stop() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
		<-c.done
	}
}
