// Command orders is idem's example service: a small orders API protected by
// Idempotency-Key on Gin, Echo or chi, with a GORM, database/sql or pgx
// store on SQLite (embedded, the default), Postgres or MySQL/MariaDB.
//
//	go run ./examples/orders [-framework gin|echo|chi] [-store gorm|sql|pgx] [-db sqlite|postgres|mysql] [-dsn DSN]
//
// README.md in this directory has every flag and the HTTP interface.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/syncclock"
	"github.com/idemkit/idem/examples/benchrig"
	"github.com/idemkit/idem/examples/internal/serve"
)

// options are the flags (README.md has each one's meaning and default).
type options struct {
	addr, framework, store, db, dsn                        string
	workDelay, sweepEvery, completeEvery, lease, retention time.Duration
	rig                                                    benchrig.Flags // the benchmark scripts' hidden flags
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
	o.rig.Register(flag.CommandLine)
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

	b, err := openBackend(ctx, o)
	if err != nil {
		return err
	}
	defer b.close()

	// Leases and expiry follow the database's clock, so replicas whose wall
	// clocks drift still agree on who owns a key.
	clock, err := syncclock.New(ctx, b.store, 0)
	if err != nil {
		return err
	}
	defer clock.Stop()

	a := &app{repo: b.repo, provider: b.provider, outside: b.store.WithoutTx, workDelay: o.workDelay}
	// What the benchmarks and the end-to-end tests add (examples/benchrig):
	// GET /healthz, the access log, -unprotected-route's routes, -pprof-addr.
	rig, err := benchrig.Start(ctx, o.rig, b.rig, a.createOrder, logger)
	if err != nil {
		return fmt.Errorf("benchmark rig: %w", err)
	}
	engineOpts := []core.Option{
		core.WithClock(clock.Now),
		core.WithLease(o.lease),
		// The access log (rig) writes a line per request; the engine's own log
		// adds only warnings (indeterminate outcomes, lost leases, store errors).
		core.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
		rig.Observer(),
	}
	if o.retention > 0 {
		engineOpts = append(engineOpts, core.Retention(o.retention))
	}
	h, e, err := newRouter(o.framework, b.store, a, rig.Routes, engineOpts)
	if err != nil {
		return err
	}

	sweeper := e.Sweeper() // the engine's store, clock and logger
	sweeper.Every = o.sweepEvery
	sweeper.Start(ctx)
	defer sweeper.Stop()

	// The completer settles payments left indeterminate, or whose attempt
	// died, without waiting for a retry (every replica runs one; a record is
	// visited by one at a time). -complete-every 0: an operator settles them.
	if o.completeEvery > 0 {
		completer := e.Completer()
		completer.Every = o.completeEvery
		if err := completer.Start(ctx); err != nil {
			return err
		}
		defer completer.Stop()
	}

	return serve.Run(ctx, logger, "orders", o.addr, rig.Handler(h), "framework", o.framework, "store", o.store, "db", o.db)
}
