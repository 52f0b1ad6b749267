// Package benchrig is what the end-to-end tests (examples/e2e) and the
// end-to-end benchmarks (scripts/bench-e2e.sh, scripts/profile-e2e.sh)
// add to the example service (examples/orders), kept out of the example
// itself behind one call, Start: GET /healthz, the access log the tests
// read (one line per request with its idempotency decision), and the
// benchmark mode (the hidden -unprotected-route and -pprof-addr flags):
// the baselines of the end-to-end benchmark and the realistic payment
// transaction of issue 15.
//
//   - POST /orders-unprotected: the example's POST /orders handler in a
//     transaction of its own, without the idempotency middleware;
//   - POST /settle (protected, atomic mode) and POST /settle-unprotected
//     (the same handler in a transaction of its own): settle a payment on
//     one of Orders seeded orders (lock the order row, insert the payment,
//     update the order, insert an outbox row).
//
// Like the protected route in atomic mode, an unprotected route holds its
// response until its transaction has committed (rolled back on a 5xx), and
// puts the transaction in the context the way the middleware does, so the
// handler code is the same on both.
package benchrig

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/gorm"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore"
)

// Orders is the number of seeded orders /settle picks from.
const Orders = 1000

// Route is one of the rig's routes, for the service's router to register
// behind its authentication: Protected ones behind the idempotency
// middleware (atomic mode) too.
type Route struct {
	Path      string
	Handler   http.HandlerFunc
	Protected bool
}

// Backend is the service's database as the rig uses it: the transaction
// of the unprotected routes, and the settle statements on the transaction
// the request's context carries.
type Backend struct {
	dialect string // sqlite, postgres or mysql
	exec    func(ctx context.Context, query string, args ...any) error
	// lock runs the row lock of the order and scans its amount.
	lock  func(ctx context.Context, query string, order int64, due *int64) error
	begin func(ctx context.Context) (txCtx context.Context, commit, rollback func() error, err error)
}

// SQL is the rig on database/sql (sqlstore).
func SQL(db *sql.DB, dialect string) Backend {
	conn := func(ctx context.Context) sqlstore.Conn {
		if tx := sqlstore.TxFrom(ctx); tx != nil {
			return tx
		}
		return db
	}
	return Backend{
		dialect: dialect,
		exec: func(ctx context.Context, q string, args ...any) error {
			_, err := conn(ctx).ExecContext(ctx, Rebind(dialect, q), args...)
			return err
		},
		lock: func(ctx context.Context, q string, order int64, due *int64) error {
			return conn(ctx).QueryRowContext(ctx, Rebind(dialect, q), order).Scan(due)
		},
		begin: func(ctx context.Context) (context.Context, func() error, func() error, error) {
			tx, err := db.BeginTx(ctx, txOptions(dialect))
			if err != nil {
				return nil, nil, nil, err
			}
			return sqlstore.WithTx(ctx, tx), tx.Commit, tx.Rollback, nil
		},
	}
}

// GORM is the rig on GORM (gormstore, with its plugin on db).
func GORM(db *gorm.DB, dialect string) Backend {
	return Backend{
		dialect: dialect,
		exec: func(ctx context.Context, q string, args ...any) error {
			return db.WithContext(ctx).Exec(q, args...).Error
		},
		lock: func(ctx context.Context, q string, order int64, due *int64) error {
			return db.WithContext(ctx).Raw(q, order).Scan(due).Error
		},
		begin: func(ctx context.Context) (context.Context, func() error, func() error, error) {
			tx := db.WithContext(ctx).Begin(txOptions(dialect))
			if tx.Error != nil {
				return nil, nil, nil, tx.Error
			}
			return gormstore.WithTx(ctx, tx), func() error { return tx.Commit().Error }, func() error { return tx.Rollback().Error }, nil
		},
	}
}

// PGX is the rig on native pgx (pgxstore), Postgres only.
func PGX(pool *pgxpool.Pool) Backend {
	c := func(ctx context.Context) pgxConn {
		if tx := pgxstore.TxFrom(ctx); tx != nil {
			return tx
		}
		return pool
	}
	return Backend{
		dialect: "postgres",
		exec: func(ctx context.Context, q string, args ...any) error {
			_, err := c(ctx).Exec(ctx, Rebind("postgres", q), args...)
			return err
		},
		lock: func(ctx context.Context, q string, order int64, due *int64) error {
			return c(ctx).QueryRow(ctx, Rebind("postgres", q), order).Scan(due)
		},
		begin: func(ctx context.Context) (context.Context, func() error, func() error, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, nil, nil, err
			}
			return pgxstore.WithTx(ctx, tx), func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }, nil
		},
	}
}

// pgxConn is what the rig runs statements on: the pool or a pgx.Tx.
type pgxConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Routes creates and seeds the benchmark's tables and returns the rig's
// routes; createOrder is the service's POST /orders handler.
func (b Backend) Routes(ctx context.Context, createOrder http.HandlerFunc) ([]Route, error) {
	for _, stmt := range schema(b.dialect) {
		if err := b.exec(ctx, stmt); err != nil {
			return nil, err
		}
	}
	return []Route{
		{Path: "/orders-unprotected", Handler: b.inTx(createOrder)},
		{Path: "/settle-unprotected", Handler: b.inTx(b.settle)},
		{Path: "/settle", Handler: b.settle, Protected: true},
	}, nil
}

// schema creates and seeds the benchmark's tables.
func schema(dialect string) []string {
	ts := map[string]string{"mysql": "DATETIME(6)", "sqlite": "DATETIME"}[dialect]
	if ts == "" {
		ts = "TIMESTAMPTZ"
	}
	var rows []string
	for i := 1; i <= Orders; i++ {
		rows = append(rows, "("+strconv.Itoa(i)+", 150000, 0)")
	}
	seed := `INSERT INTO bench_orders (id, amount_cents, paid_cents) VALUES ` + strings.Join(rows, ", ")
	if dialect == "mysql" {
		seed = strings.Replace(seed, "INSERT", "INSERT IGNORE", 1)
	} else {
		seed += ` ON CONFLICT DO NOTHING`
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS bench_orders (id BIGINT PRIMARY KEY, amount_cents BIGINT NOT NULL, paid_cents BIGINT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS bench_payments (order_id BIGINT NOT NULL, amount_cents BIGINT NOT NULL, created_at ` + ts + ` NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS bench_outbox (topic VARCHAR(64) NOT NULL, payload VARCHAR(255) NOT NULL, created_at ` + ts + ` NOT NULL)`,
		seed,
	}
}

// settle is POST /settle and /settle-unprotected: four statements, with ?
// placeholders, on the request's transaction (SQLite has no FOR UPDATE:
// its transaction holds the write lock anyway).
func (b Backend) settle(w http.ResponseWriter, r *http.Request) {
	ctx, order, amount, now := r.Context(), 1+rand.Int64N(Orders), int64(1500), time.Now().UTC()
	lock := `SELECT amount_cents FROM bench_orders WHERE id = ? FOR UPDATE`
	if b.dialect == "sqlite" {
		lock = `SELECT amount_cents FROM bench_orders WHERE id = ?`
	}
	var due int64
	err := b.lock(ctx, lock, order, &due)
	if err == nil {
		err = b.exec(ctx, `INSERT INTO bench_payments (order_id, amount_cents, created_at) VALUES (?, ?, ?)`, order, amount, now)
	}
	if err == nil {
		err = b.exec(ctx, `UPDATE bench_orders SET paid_cents = paid_cents + ? WHERE id = ?`, amount, order)
	}
	if err == nil {
		err = b.exec(ctx, `INSERT INTO bench_outbox (topic, payload, created_at) VALUES ('payment.settled', ?, ?)`, strconv.FormatInt(order, 10), now)
	}
	if err != nil {
		problem(w, http.StatusInternalServerError, "could not settle the payment")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]int64{"order_id": order, "amount_cents": amount})
}

// inTx runs next in a transaction of its own and sends its response once
// the transaction has committed.
func (b Backend) inTx(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, commit, rollback, err := b.begin(r.Context())
		if err != nil {
			problem(w, http.StatusServiceUnavailable, "could not begin a transaction")
			return
		}
		hw := &heldWriter{h: w.Header(), status: http.StatusOK}
		next(hw, r.WithContext(ctx))
		if hw.status >= 500 {
			_ = rollback()
		} else if err := commit(); err != nil {
			clear(w.Header())
			problem(w, http.StatusServiceUnavailable, "could not commit")
			return
		}
		w.WriteHeader(hw.status)
		_, _ = w.Write(hw.body.Bytes())
	}
}

// heldWriter holds a response until inTx sends it.
type heldWriter struct {
	h      http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (w *heldWriter) Header() http.Header { return w.h }

func (w *heldWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.status, w.wrote = code, true
	}
}

func (w *heldWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.body.Write(b)
}

func problem(w http.ResponseWriter, status int, detail string) {
	core.WriteProblem(w, nil, &core.Problem{Title: http.StatusText(status), Status: status, Detail: detail})
}

// txOptions are the stores' own: READ COMMITTED on MySQL/MariaDB.
func txOptions(dialect string) *sql.TxOptions {
	if dialect == "mysql" {
		return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return nil
}

// Rebind rewrites ? placeholders as $1, $2, ... for Postgres (the
// example service's repositories use it too).
func Rebind(dialect, query string) string {
	if dialect != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ServePprof serves the runtime profiles on addr (the service's hidden
// -pprof-addr flag), on a mux of its own so the API's router never exposes
// them:
//
//	go tool pprof 'http://ADDR/debug/pprof/profile?seconds=15'
func ServePprof(addr string, logger *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	go func() {
		if err := http.ListenAndServe(addr, mux); err != nil {
			logger.Error("orders: pprof: " + err.Error())
		}
	}()
}
