// Command orders is idem's example service: a small orders API protected by
// Idempotency-Key on Gin, Echo or chi, with a GORM or database/sql store on
// SQLite (embedded, the default), Postgres or MySQL/MariaDB, or the native
// pgx store on Postgres.
//
//	go run ./examples/orders [-addr 127.0.0.1:8080] [-framework gin|echo|chi]
//	    [-store gorm|sql|pgx] [-db sqlite|postgres|mysql] [-dsn DSN]
//	    [-work-delay 0s] [-sweep-every 1m] [-lease 30s] [-retention 24h]
//	    [-complete-every 10s]
//
// See README.md in this directory for the HTTP interface; the OpenTelemetry
// wiring of such a service is the example examples/otel.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/syncclock"
	"github.com/idemkit/idem/examples/benchrig"
)

type options struct {
	addr       string
	framework  string
	store      string
	db         string
	dsn        string
	workDelay  time.Duration
	sweepEvery time.Duration
	// completeEvery: how often the completer looks for stuck payments.
	completeEvery time.Duration
	lease         time.Duration
	retention     time.Duration
	// unprotected and pprofAddr are the benchmark mode's hidden flags
	// (examples/benchrig): its routes, and net/http/pprof on a listener
	// of its own.
	unprotected bool
	pprofAddr   string
}

func main() {
	var o options
	flag.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen address")
	flag.StringVar(&o.framework, "framework", "gin", "router: gin, echo or chi")
	flag.StringVar(&o.store, "store", "gorm", "idempotency store: gorm, sql or pgx (native pgx, -db postgres)")
	flag.StringVar(&o.db, "db", "sqlite", "database: sqlite, postgres or mysql")
	flag.StringVar(&o.dsn, "dsn", "", "database DSN (default for sqlite: orders.db in the working directory)")
	flag.DurationVar(&o.workDelay, "work-delay", 0, "simulated slow work inside each request (to try a concurrent retry by hand)")
	flag.DurationVar(&o.sweepEvery, "sweep-every", time.Minute, "how often expired idempotency records are deleted")
	flag.DurationVar(&o.completeEvery, "complete-every", core.DefaultCompleteEvery, "how often the completer settles stuck payments without a client (0: no completer)")
	flag.DurationVar(&o.lease, "lease", core.DefaultLease, "lease of a running payment (leased mode)")
	flag.DurationVar(&o.retention, "retention", core.DefaultRetention, "how long idempotency records are kept (a retry after this window runs again)")
	flag.BoolVar(&o.unprotected, "unprotected-route", false, "")
	flag.StringVar(&o.pprofAddr, "pprof-addr", "", "")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(o, logger); err != nil {
		logger.Error("orders: " + err.Error())
		os.Exit(1)
	}
}

func run(o options, logger *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if o.pprofAddr != "" {
		benchrig.ServePprof(o.pprofAddr, logger)
	}
	b, err := openBackend(ctx, o)
	if err != nil {
		return err
	}
	defer b.close()

	// Leases and expiry follow the database's clock, so replicas whose wall
	// clocks drift still agree on who owns a key.
	src, ok := b.store.(syncclock.TimeSource)
	if !ok {
		return fmt.Errorf("store %T cannot read the database clock", b.store)
	}
	clock, err := syncclock.New(ctx, src, 0)
	if err != nil {
		return err
	}
	defer clock.Stop()

	a := &app{repo: b.repo, provider: b.provider, workDelay: o.workDelay, outside: func(ctx context.Context) context.Context { return ctx }}
	if ts, ok := b.store.(store.TxStore); ok {
		a.outside = ts.WithoutTx
	}
	var bench []benchrig.Route
	if o.unprotected {
		if bench, err = b.rig.Routes(ctx, a.createOrder); err != nil {
			return fmt.Errorf("benchmark tables: %w", err)
		}
	}
	engineOpts := []core.Option{
		core.WithClock(clock.Now),
		core.WithLease(o.lease),
		// The access log writes the one line per request; the engine's own
		// log only adds warnings (indeterminate outcomes, lost leases,
		// store errors).
		core.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
		core.WithObserver(recordDecision),
	}
	if o.retention > 0 {
		engineOpts = append(engineOpts, core.Retention(o.retention))
	}
	h, e, err := newRouter(o.framework, b.store, a, bench, engineOpts)
	if err != nil {
		return err
	}

	sweeper := e.Sweeper() // the engine's store, clock and logger
	sweeper.Every = o.sweepEvery
	sweeper.Start(ctx)
	defer sweeper.Stop()

	// The completer settles payments left indeterminate, or whose
	// attempt died, without waiting for the client's retry (every
	// replica runs one; each record is visited by one at a time).
	// -complete-every 0 runs none (an operator settles them), and a
	// store that keeps no marks (store.Settler) has none to run.
	if _, marks := b.store.(store.Settler); marks && o.completeEvery > 0 {
		completer := e.Completer()
		completer.Every = o.completeEvery
		if err := completer.Start(ctx); err != nil {
			return err
		}
		defer completer.Stop()
	}

	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: accessLog(logger, h), ReadHeaderTimeout: 10 * time.Second}
	logger.Info("orders: listening", "addr", ln.Addr().String(), "framework", o.framework, "store", o.store, "db", o.db)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info("orders: shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// --- one log line per request, with the idempotency decision ---------------

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
