package core

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// leases is the heartbeat of an engine's leased attempts: one timer
// (time.AfterFunc), armed while leased attempts run, extends every held
// lease each third of the lease. It is armed by the first leased attempt
// after an idle spell and disarms itself at the first tick that finds none
// held, so steady traffic costs no goroutine, timer or allocation per
// request, and an idle engine holds no goroutine at all. A per-attempt
// timer would cost allocations on every request.
type leases struct {
	mu    sync.Mutex
	held  map[*attempt]struct{}
	timer *time.Timer // runs heartbeat; made when the engine turns busy
	armed bool        // the timer is pending or its heartbeat is running
	batch []*attempt  // the heartbeat's scratch (one heartbeat at a time)
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
	}
	l.held[a] = struct{}{}
	if !l.armed {
		// A new timer each time the engine turns busy (not per request:
		// it stays armed while attempts keep coming), so the timer belongs
		// to the current goroutine's time (a testing/synctest bubble, or
		// none) rather than to wherever the engine was first used.
		l.armed = true
		l.timer = time.AfterFunc(e.cfg.lease/3, e.heartbeat)
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
	l.mu.Unlock()
	return a.lost.Load()
}

// heartbeat extends every held lease, then arms the timer for the next
// tick; with none held it disarms instead.
func (e *Engine) heartbeat() {
	every := e.cfg.lease / 3
	start := time.Now()
	l := &e.leases
	l.mu.Lock()
	if len(l.held) == 0 {
		l.armed = false
		l.mu.Unlock()
		return
	}
	batch := l.batch[:0]
	for a := range l.held {
		if !a.expired.Load() { // past MaxAttempt: the lease lapses
			batch = append(batch, a)
		}
	}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, a := range batch {
		wg.Go(func() { e.extend(a, every) })
	}
	wg.Wait()
	clear(batch)
	l.mu.Lock()
	l.batch = batch
	l.timer.Reset(max(every-time.Since(start), 0))
	l.mu.Unlock()
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
