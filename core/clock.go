package core

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// TimeSource reads a clock that every process sharing a store agrees on:
// the database's. The SQL stores implement it.
type TimeSource interface {
	Now(ctx context.Context) (time.Time, error)
}

// SyncedClock is a clock that follows a TimeSource without asking it on
// every request: it samples the source every so often, keeps the offset
// between the source and the local clock (corrected by half the round trip
// of the sample), and answers local time plus that offset. Processes whose
// wall clocks differ by seconds then agree on lease and expiry decisions
// within a few milliseconds (the round trip of a sample), because each
// reads the database's clock through its own offset. Pass its Now to
// WithClock.
type SyncedClock struct {
	src   TimeSource
	local func() time.Time

	mu     sync.RWMutex
	offset time.Duration
	rtt    time.Duration

	stop chan struct{}
	done chan struct{}
}

// DefaultClockSync is how often a SyncedClock samples its source.
const DefaultClockSync = 10 * time.Second

// NewSyncedClock samples src once (failing if it cannot) and then every
// `every` (DefaultClockSync when zero) in the background until Stop.
// Failed samples keep the last offset and are logged.
func NewSyncedClock(ctx context.Context, src TimeSource, every time.Duration) (*SyncedClock, error) {
	return newSyncedClock(ctx, src, every, time.Now)
}

func newSyncedClock(ctx context.Context, src TimeSource, every time.Duration, local func() time.Time) (*SyncedClock, error) {
	if every <= 0 {
		every = DefaultClockSync
	}
	c := &SyncedClock{src: src, local: local, stop: make(chan struct{}), done: make(chan struct{})}
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
func (c *SyncedClock) Sync(ctx context.Context) error {
	before := c.local()
	remote, err := c.src.Now(ctx)
	after := c.local()
	if err != nil {
		return fmt.Errorf("%w: reading the database clock: %w", ErrStoreUnavailable, err)
	}
	rtt := after.Sub(before)
	mid := before.Add(rtt / 2)
	c.mu.Lock()
	c.offset, c.rtt = remote.Sub(mid), rtt
	c.mu.Unlock()
	return nil
}

// Now returns the source's time, estimated from the local clock.
func (c *SyncedClock) Now() time.Time {
	c.mu.RLock()
	off := c.offset
	c.mu.RUnlock()
	return c.local().Add(off)
}

// Offset reports the last measured offset of the source from the local
// clock, and the round trip of that sample (the bound on its error).
func (c *SyncedClock) Offset() (offset, uncertainty time.Duration) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.offset, c.rtt / 2
}

// Stop ends the background sampling.
func (c *SyncedClock) Stop() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
		<-c.done
	}
}
