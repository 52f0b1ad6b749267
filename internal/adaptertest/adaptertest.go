// Package adaptertest holds what the tests of the Gin, Echo and chi
// adapters share: an engine that logs nothing and reports every decision
// (its scope, its route label), and a one-line request helper. It is a test helper of
// this repository, not part of idem's API: internal, so only modules under
// github.com/idemkit/idem (the adapters) can import it, from their tests.
//
// The behaviour every adapter must show is in core/scenario; these helpers
// serve each adapter's own tests of its framework's idioms.
package adaptertest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// Body is the JSON body every request of Do carries.
const Body = `{"amount":10}`

// Events records the decisions of an engine.
type Events struct {
	mu     sync.Mutex
	events []observe.Event
}

// Observe is the engine's observer (core.WithObserver).
func (ev *Events) Observe(_ context.Context, e observe.Event) {
	ev.mu.Lock()
	ev.events = append(ev.events, e)
	ev.mu.Unlock()
}

// Last returns the scope of the latest decision, "" if there was none.
func (ev *Events) Last() string { return ev.last().Scope }

// Route returns the route label (observe.Event.Route) of the latest
// decision, "" if there was none.
func (ev *Events) Route() string { return ev.last().Route }

// Len returns how many decisions there were.
func (ev *Events) Len() int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return len(ev.events)
}

func (ev *Events) last() observe.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.events) == 0 {
		return observe.Event{}
	}
	return ev.events[len(ev.events)-1]
}

// NewEngine returns an engine over st (a leased memstore when nil) for a
// single caller, that logs nothing and reports its decisions to the
// returned Events; opts come after those defaults and may override them.
func NewEngine(t *testing.T, st store.Store, opts ...core.Option) (*core.Engine, *Events) {
	t.Helper()
	if st == nil {
		st = memstore.New()
	}
	ev := &Events{}
	opts = append([]core.Option{core.WithSingleCaller(), core.WithObserver(ev.Observe),
		core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	e, err := core.New(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e, ev
}

// Do sends method path with Body to h, with the Idempotency-Key key (none
// when "") and the header name-value pairs, and returns what h answered.
func Do(h http.Handler, method, path, key string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(Body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(core.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// Replayed reports whether w carries Idempotent-Replayed: true.
func Replayed(w *httptest.ResponseRecorder) bool {
	return w.Header().Get(core.HeaderReplayed) == "true"
}

// Logs is a slog.Handler that keeps every record an engine logs
// (core.WithLogger(slog.New(logs))).
type Logs struct {
	mu      sync.Mutex
	records []slog.Record
}

// Enabled implements slog.Handler: every level.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.records = append(l.records, r.Clone())
	l.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler (the engine adds none).
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler (the engine opens none).
func (l *Logs) WithGroup(string) slog.Handler { return l }

// Find returns the level of the first record whose message or attribute
// values contain s, and whether there is one.
func (l *Logs) Find(s string) (slog.Level, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		found := strings.Contains(r.Message, s)
		r.Attrs(func(a slog.Attr) bool {
			found = found || strings.Contains(a.Value.String(), s)
			return !found
		})
		if found {
			return r.Level, true
		}
	}
	return 0, false
}
