package core_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestSweeperStartStop: Stop right after Start, Stop twice, Stop without
// Start and many concurrent Start/Stop cycles never panic and never leave
// a sweep running (run with -race).
func TestSweeperStartStop(t *testing.T) {
	st := memstore.New()
	quietLogger := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Run("StopWithoutStart", func(t *testing.T) {
		s := &core.Sweeper{Store: st, Logger: quietLogger}
		s.Stop()
		s.Stop()
	})
	t.Run("StopRightAfterStartTwice", func(t *testing.T) {
		for range 500 {
			s := &core.Sweeper{Store: st, Every: time.Hour, Logger: quietLogger}
			s.Start(context.Background())
			s.Stop()
			s.Stop()
		}
	})
	t.Run("RestartCycles", func(t *testing.T) {
		s := &core.Sweeper{Store: st, Every: time.Millisecond, Logger: quietLogger}
		for range 300 {
			s.Start(context.Background())
			s.Stop()
		}
	})
	t.Run("ConcurrentStartStop", func(t *testing.T) {
		s := &core.Sweeper{Store: st, Every: time.Millisecond, Logger: quietLogger}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 200 {
					s.Start(context.Background())
					s.Stop()
				}
			})
		}
		wg.Wait()
		s.Stop()
	})
}
