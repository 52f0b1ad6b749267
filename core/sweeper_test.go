package core_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
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

// TestSweeperNotFromEngine: a Sweeper not made by Engine.Sweeper (a struct
// literal, which still compiles since its store became unexported) fails
// loudly with the fix: Sweep with an ErrConfig error, Start with a panic
// in the caller's goroutine, never a nil dereference in the background.
func TestSweeperNotFromEngine(t *testing.T) {
	s := &core.Sweeper{Every: time.Minute}
	if _, err := s.Sweep(context.Background()); !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), "Engine.Sweeper") {
		t.Errorf("Sweep: %v, want ErrConfig naming Engine.Sweeper", err)
	}
	defer func() {
		v := recover()
		if v == nil || !strings.Contains(fmt.Sprint(v), "Engine.Sweeper") {
			t.Errorf("Start: recovered %v, want a panic naming Engine.Sweeper", v)
		}
		s.Stop()
	}()
	s.Start(context.Background())
}
