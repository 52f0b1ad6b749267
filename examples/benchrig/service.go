package benchrig

import (
	"context"
	"flag"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/observe"
)

// Flags are the service's hidden flags of the benchmark mode.
type Flags struct {
	Unprotected bool   // -unprotected-route: the routes of Backend.Routes
	PprofAddr   string // -pprof-addr: net/http/pprof on a listener of its own
}

// Register adds -unprotected-route and -pprof-addr to fs, without usage
// text (they are the benchmark scripts', not the example's).
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.BoolVar(&f.Unprotected, "unprotected-route", false, "")
	fs.StringVar(&f.PprofAddr, "pprof-addr", "", "")
}

// Rig is what the service takes from the rig: the engine option and the
// handler of the access log, and the benchmark's routes.
type Rig struct {
	// Routes are the benchmark's routes (none without -unprotected-route),
	// for the service's router to register.
	Routes []Route
	logger *slog.Logger
}

// Start is the rig of the service whose database is b and whose POST
// /orders handler is createOrder: it serves pprof (f.PprofAddr), creates
// the benchmark's tables and routes (f.Unprotected), and logs each
// request with its idempotency decision on logger, the one line per
// request the end-to-end tests (examples/e2e) read.
func Start(ctx context.Context, f Flags, b Backend, createOrder http.HandlerFunc, logger *slog.Logger) (*Rig, error) {
	if f.PprofAddr != "" {
		ServePprof(f.PprofAddr, logger)
	}
	r := &Rig{logger: logger}
	if f.Unprotected {
		var err error
		if r.Routes, err = b.Routes(ctx, createOrder); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Observer is the engine's option that hands each decision to the access
// log of the same request (Log).
func (r *Rig) Observer() core.Option { return core.WithObserver(recordDecision) }

// Handler is next behind GET /healthz (the scripts' and the tests' "is
// it up") and the access log: one line per request, with the idempotency
// decision (Observer) when there was one.
func (r *Rig) Handler(next http.Handler) http.Handler {
	return accessLog(r.logger, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet && req.URL.Path == "/healthz" {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		next.ServeHTTP(w, req)
	}))
}

type decisionKey struct{}

type decisionSlot struct {
	mu sync.Mutex
	ev *observe.Event
}

// recordDecision is the engine's observer: it hands the decision to the
// access log of the same request.
func recordDecision(ctx context.Context, ev observe.Event) {
	if s, ok := ctx.Value(decisionKey{}).(*decisionSlot); ok {
		s.mu.Lock()
		s.ev = &ev
		s.mu.Unlock()
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func accessLog(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		slot := &decisionSlot{}
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			attrs := []any{"method", r.Method, "path", r.URL.Path, "status", sw.status, "duration", time.Since(start).Round(time.Microsecond)}
			slot.mu.Lock()
			if ev := slot.ev; ev != nil {
				attrs = append(attrs, "idempotency", string(ev.Decision), "key", ev.Key)
				if ev.Attempt > 1 {
					attrs = append(attrs, "attempt", ev.Attempt)
				}
				if ev.Err != nil {
					attrs = append(attrs, "reason", ev.Err.Error())
				}
			} else {
				attrs = append(attrs, "idempotency", "none")
			}
			slot.mu.Unlock()
			logger.Info("request", attrs...)
		}()
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), decisionKey{}, slot)))
	})
}
