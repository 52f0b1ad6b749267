package main

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The benchmark mode's realistic payment transaction (issue 15), served
// with -unprotected-route: POST /settle (protected, atomic mode) and
// POST /settle-unprotected (the same handler in its own transaction). It
// settles a payment on one of benchOrders seeded orders: lock the order
// row, insert the payment, update the order, insert an outbox row.

const benchOrders = 1000

// benchSchema creates and seeds the benchmark's tables.
func benchSchema(dialect string) []string {
	ts := map[string]string{"mysql": "DATETIME(6)", "sqlite": "DATETIME"}[dialect]
	if ts == "" {
		ts = "TIMESTAMPTZ"
	}
	var rows []string
	for i := 1; i <= benchOrders; i++ {
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

// settleStatements are the four statements, with ? placeholders (SQLite
// has no FOR UPDATE: its transaction holds the write lock anyway).
func settleStatements(dialect string) [4]string {
	lock := `SELECT amount_cents FROM bench_orders WHERE id = ? FOR UPDATE`
	if dialect == "sqlite" {
		lock = `SELECT amount_cents FROM bench_orders WHERE id = ?`
	}
	return [4]string{
		lock,
		`INSERT INTO bench_payments (order_id, amount_cents, created_at) VALUES (?, ?, ?)`,
		`UPDATE bench_orders SET paid_cents = paid_cents + ? WHERE id = ?`,
		`INSERT INTO bench_outbox (topic, payload, created_at) VALUES ('payment.settled', ?, ?)`,
	}
}

// settle is POST /settle and /settle-unprotected.
func (a *app) settle(w http.ResponseWriter, r *http.Request) {
	order := 1 + rand.Int64N(benchOrders)
	if err := a.repo.settle(r.Context(), order, 1500, time.Now().UTC()); err != nil {
		problem(w, http.StatusInternalServerError, "internal", "could not settle the payment")
		return
	}
	writeJSON(w, http.StatusCreated, map[string]int64{"order_id": order, "amount_cents": 1500})
}

// benchRepo is what the benchmark mode adds to a repo.
type benchRepo interface {
	benchMigrate(ctx context.Context) error
	settle(ctx context.Context, order, amount int64, now time.Time) error
}

func (r *sqlRepo) benchMigrate(ctx context.Context) error {
	for _, stmt := range benchSchema(r.dialect) {
		if _, err := r.db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

func (r *sqlRepo) settle(ctx context.Context, order, amount int64, now time.Time) error {
	c, q := r.conn(ctx), settleStatements(r.dialect)
	var due int64
	if err := c.QueryRowContext(ctx, r.q(q[0]), order).Scan(&due); err != nil {
		return err
	}
	if _, err := c.ExecContext(ctx, r.q(q[1]), order, amount, now); err != nil {
		return err
	}
	if _, err := c.ExecContext(ctx, r.q(q[2]), amount, order); err != nil {
		return err
	}
	_, err := c.ExecContext(ctx, r.q(q[3]), strconv.FormatInt(order, 10), now)
	return err
}

func (r *gormRepo) benchMigrate(ctx context.Context) error {
	for _, stmt := range benchSchema(r.dialect) {
		if err := r.db.WithContext(ctx).Exec(stmt).Error; err != nil {
			return err
		}
	}
	return nil
}

func (r *gormRepo) settle(ctx context.Context, order, amount int64, now time.Time) error {
	db, q := r.tx(ctx), settleStatements(r.dialect)
	var due int64
	if err := db.Raw(q[0], order).Scan(&due).Error; err != nil {
		return err
	}
	if err := db.Exec(q[1], order, amount, now).Error; err != nil {
		return err
	}
	if err := db.Exec(q[2], amount, order).Error; err != nil {
		return err
	}
	return db.Exec(q[3], strconv.FormatInt(order, 10), now).Error
}

func (r *pgxRepo) benchMigrate(ctx context.Context) error {
	for _, stmt := range benchSchema("postgres") {
		if _, err := r.pool.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

func (r *pgxRepo) settle(ctx context.Context, order, amount int64, now time.Time) error {
	c, q := r.conn(ctx), settleStatements("postgres")
	var due int64
	if err := c.QueryRow(ctx, dollar(q[0]), order).Scan(&due); err != nil {
		return err
	}
	if _, err := c.Exec(ctx, dollar(q[1]), order, amount, now); err != nil {
		return err
	}
	if _, err := c.Exec(ctx, dollar(q[2]), amount, order); err != nil {
		return err
	}
	_, err := c.Exec(ctx, dollar(q[3]), strconv.FormatInt(order, 10), now)
	return err
}

// dollar rewrites ? placeholders as $1, $2, ...
func dollar(query string) string { return (&sqlRepo{dialect: "postgres"}).q(query) }
