package core

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// leases is the heartbeat of an engine's leased attempts: one goroutine,
// alive while at least one leased attempt runs, extends every held lease
// each third of the lease. A per-attempt timer would cost allocations on
// every request; a shared ticker costs none.
type leases struct {
	mu      sync.Mutex
	held    map[*attempt]struct{}
	running bool
	idle    chan struct{} // signalled when held becomes empty
}

// hold starts extending a's lease (leased mode; a no-op in atomic mode).
func (e *Engine) hold(a *attempt) {
	if a.rt.atomic {
		return
	}
	l := &e.leases
	l.mu.Lock()
	if l.held == nil {
		l.held = make(map[*attempt]struct{})
		l.idle = make(chan struct{}, 1)
	}
	l.held[a] = struct{}{}
	if !l.running {
		l.running = true
		go e.heartbeat()
	}
	l.mu.Unlock()
}

// unhold stops extending a's lease and reports whether it was lost.
func (e *Engine) unhold(a *attempt) (lost bool) {
	if a.rt.atomic {
		return false
	}
	l := &e.leases
	l.mu.Lock()
	delete(l.held, a)
	if len(l.held) == 0 && l.running {
		select { // let the heartbeat goroutine end now rather than at its next tick
		case l.idle <- struct{}{}:
		default:
		}
	}
	l.mu.Unlock()
	return a.lost.Load()
}

func (e *Engine) heartbeat() {
	every := e.cfg.lease / 3
	t := time.NewTicker(every)
	defer t.Stop()
	var batch []*attempt
	l := &e.leases
	for {
		var tick bool
		select {
		case <-t.C:
			tick = true
		case <-l.idle:
		}
		l.mu.Lock()
		if len(l.held) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		if !tick {
			l.mu.Unlock()
			continue
		}
		batch = batch[:0]
		for a := range l.held {
			batch = append(batch, a)
		}
		l.mu.Unlock()
		var wg sync.WaitGroup
		for _, a := range batch {
			wg.Go(func() { e.extend(a, every) })
		}
		wg.Wait()
		clear(batch)
	}
}

// extend moves a's lease forward; a fenced answer means another attempt
// took the record over: the handler's context is cancelled with
// ErrLeaseLost and the attempt's completion will be refused.
func (e *Engine) extend(a *attempt, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), timeout)
	err := e.store.Extend(ctx, a.id, a.token, e.cfg.clock().Add(e.cfg.lease))
	cancel()
	switch {
	case errors.Is(err, ErrFenced):
		l := &e.leases
		l.mu.Lock()
		_, still := l.held[a]
		delete(l.held, a)
		l.mu.Unlock()
		if still {
			a.lost.Store(true)
			if a.cancel != nil {
				a.cancel(ErrLeaseLost)
			}
		}
	case err != nil:
		e.cfg.logger.Warn("idempotency: extending a lease failed; retrying", slog.String("id", a.id.String()), slog.String("error", err.Error()))
	}
}
