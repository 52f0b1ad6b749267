package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/idem/core/store"
)

// Sweeper deletes expired records on a schedule, in bounded batches, so
// retention actually runs. Several processes may sweep the same store at
// once: stores delete each row once. Engine.Sweeper makes one.
type Sweeper struct {
	// Every is the pause between sweeps (default DefaultSweepEvery).
	Every time.Duration
	// Batch is the most rows one DeleteExpired call deletes (default
	// DefaultSweepBatch); a sweep repeats batches until one comes back short.
	Batch int

	store  store.Store
	clock  func() time.Time // the time expiry is compared with
	logger *slog.Logger     // reports failures
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Sweeper returns a sweeper of the engine's store that compares expiry
// with the engine's clock (WithClock) and logs to the engine's logger
// (WithLogger). Set Every and Batch before Start. A Sweeper made any
// other way (a struct literal) fails: Sweep with ErrConfig, Start panics.
func (e *Engine) Sweeper() *Sweeper {
	return &Sweeper{store: e.store, clock: e.cfg.clock, logger: e.cfg.logger}
}

// errNoEngine is the error of a Sweeper that Engine.Sweeper did not make.
var errNoEngine = fmt.Errorf("%w: a core.Sweeper must be made with Engine.Sweeper (e.Sweeper()), which gives it the engine's store, clock and logger", ErrConfig)

// Sweep deletes every record expired at the sweeper's clock, batch by batch,
// and returns how many it deleted.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	if s.store == nil {
		return 0, errNoEngine
	}
	batch := s.Batch
	if batch <= 0 {
		batch = DefaultSweepBatch
	}
	total := 0
	for {
		n, err := s.store.DeleteExpired(ctx, s.clock(), batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// Start sweeps now and then every s.Every until Stop or ctx ends. Calling
// Start on a running sweeper is a no-op.
func (s *Sweeper) Start(ctx context.Context) {
	if s.store == nil {
		panic(errNoEngine.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		return
	}
	ctx, s.cancel = context.WithCancel(ctx)
	// The goroutine closes its own channel: Stop clears s.done, and a
	// later Start makes a new one, so the field may not be read here.
	done := make(chan struct{})
	s.done = done
	every := s.Every
	if every <= 0 {
		every = DefaultSweepEvery
	}
	logger := s.logger
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if n, err := s.Sweep(ctx); err != nil && !errors.Is(err, context.Canceled) {
				logger.Error("idempotency sweep failed", slog.Int("deleted", n), slog.String("error", err.Error()))
			} else if n > 0 {
				logger.Debug("idempotency sweep", slog.Int("deleted", n))
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Stop stops a started sweeper and waits for a running sweep to end. It
// may be called at any time: before Start, twice, or right after Start.
func (s *Sweeper) Stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.cancel, s.done = nil, nil
	s.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
