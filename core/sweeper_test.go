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
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	sweeper := func(every time.Duration) *core.Sweeper {
		s := e.Sweeper()
		s.Every = every
		return s
	}
	t.Run("StopWithoutStart", func(t *testing.T) {
		s := sweeper(0)
		s.Stop()
		s.Stop()
	})
	t.Run("StopRightAfterStartTwice", func(t *testing.T) {
		for range 500 {
			s := sweeper(time.Hour)
			s.Start(context.Background())
			s.Stop()
			s.Stop()
		}
	})
	t.Run("RestartCycles", func(t *testing.T) {
		s := sweeper(time.Millisecond)
		for range 300 {
			s.Start(context.Background())
			s.Stop()
		}
	})
	t.Run("ConcurrentStartStop", func(t *testing.T) {
		s := sweeper(time.Millisecond)
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
