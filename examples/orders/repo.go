package main

import (
	"context"
	"database/sql"
	"errors"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/idemkit/idem/examples/benchrig"
	"github.com/idemkit/idem/examples/internal/fakepay"
	"github.com/idemkit/idem/sqlstore"
)

// schema creates the business tables (the idempotency table is created by
// the store). Every repo shares it.
func schema(dialect string) []string {
	id, ts, text := "BIGSERIAL PRIMARY KEY", "TIMESTAMPTZ", "VARCHAR(255)"
	switch dialect {
	case "mysql":
		id, ts = "BIGINT AUTO_INCREMENT PRIMARY KEY", "DATETIME(6)"
	case "sqlite":
		id, ts, text = "INTEGER PRIMARY KEY AUTOINCREMENT", "DATETIME", "TEXT"
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS orders (id ` + id + `, account ` + text + ` NOT NULL, item ` + text + ` NOT NULL,
			quantity INT NOT NULL, created_at ` + ts + ` NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS charges (id ` + id + `, order_id BIGINT NOT NULL, account ` + text + ` NOT NULL,
			amount_cents BIGINT NOT NULL, provider_charge_id VARCHAR(64) NOT NULL UNIQUE, created_at ` + ts + ` NOT NULL)`,
		fakepay.Schema(text), // the simulated payment provider's own table
	}
}

// --- database/sql ----------------------------------------------------------

type sqlRepo struct {
	db      *sql.DB
	dialect string
}

// conn is the middleware's transaction when there is one (atomic mode),
// else the pool.
func (r *sqlRepo) conn(ctx context.Context) sqlstore.Conn {
	if tx := sqlstore.TxFrom(ctx); tx != nil {
		return tx
	}
	return r.db
}

// rebind rewrites ? placeholders for Postgres.
func rebind(dialect, query string) string { return benchrig.Rebind(dialect, query) }

// migrate creates the business tables. Replicas may start at once: on
// Postgres, concurrent CREATE TABLE IF NOT EXISTS can fail on the catalog,
// so the statements run in one transaction behind an advisory lock.
func migrate(ctx context.Context, db *sql.DB, dialect string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if dialect == "postgres" {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(7308150817447313517)`); err != nil {
			return err
		}
	}
	for _, stmt := range schema(dialect) {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func (r *sqlRepo) insertOrder(ctx context.Context, o *Order) error {
	c := r.conn(ctx)
	const ins = `INSERT INTO orders (account, item, quantity, created_at) VALUES (?, ?, ?, ?)`
	if r.dialect == "mysql" {
		res, err := c.ExecContext(ctx, ins, o.Account, o.Item, o.Quantity, o.CreatedAt)
		if err != nil {
			return err
		}
		o.ID, err = res.LastInsertId()
		return err
	}
	return c.QueryRowContext(ctx, rebind(r.dialect, ins+` RETURNING id`), o.Account, o.Item, o.Quantity, o.CreatedAt).Scan(&o.ID)
}

func (r *sqlRepo) listOrders(ctx context.Context, account string) ([]Order, error) {
	rows, err := r.conn(ctx).QueryContext(ctx, rebind(r.dialect, `SELECT id, account, item, quantity, created_at FROM orders WHERE account = ? ORDER BY id`), account)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Order{} // [] in the JSON answer, not null
	for rows.Next() {
		var o Order
		if err := rows.Scan(&o.ID, &o.Account, &o.Item, &o.Quantity, &o.CreatedAt); err != nil {
			return nil, err
		}
		o.CreatedAt = o.CreatedAt.UTC()
		out = append(out, o)
	}
	return out, rows.Err()
}

func (r *sqlRepo) findOrder(ctx context.Context, account string, id int64) (*Order, error) {
	var o Order
	err := r.conn(ctx).QueryRowContext(ctx, rebind(r.dialect, `SELECT id, account, item, quantity, created_at FROM orders WHERE account = ? AND id = ?`), account, id).
		Scan(&o.ID, &o.Account, &o.Item, &o.Quantity, &o.CreatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errNotFound
	}
	return &o, err
}

func (r *sqlRepo) insertCharge(ctx context.Context, ch *Charge) (*Charge, error) {
	c := r.conn(ctx)
	ins := `INSERT INTO charges (order_id, account, amount_cents, provider_charge_id, created_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`
	if r.dialect == "mysql" {
		ins = `INSERT IGNORE INTO charges (order_id, account, amount_cents, provider_charge_id, created_at) VALUES (?, ?, ?, ?, ?)`
	}
	if _, err := c.ExecContext(ctx, rebind(r.dialect, ins), ch.OrderID, ch.Account, ch.AmountCents, ch.ProviderChargeID, ch.CreatedAt); err != nil {
		return nil, err
	}
	var got Charge
	err := c.QueryRowContext(ctx, rebind(r.dialect, `SELECT id, order_id, account, amount_cents, provider_charge_id, created_at FROM charges WHERE provider_charge_id = ?`), ch.ProviderChargeID).
		Scan(&got.ID, &got.OrderID, &got.Account, &got.AmountCents, &got.ProviderChargeID, &got.CreatedAt)
	got.CreatedAt = got.CreatedAt.UTC()
	return &got, err
}

// --- GORM ------------------------------------------------------------------

// gormRepo knows nothing of idem: the gormstore plugin (db.Use in
// openSQL) runs the statements of db.WithContext(ctx) in the middleware's
// transaction when ctx carries one (atomic mode), and on the pool
// otherwise.
type gormRepo struct{ db *gorm.DB }

func (r *gormRepo) insertOrder(ctx context.Context, o *Order) error {
	return r.db.WithContext(ctx).Create(o).Error
}

func (r *gormRepo) listOrders(ctx context.Context, account string) ([]Order, error) {
	out := []Order{}
	err := r.db.WithContext(ctx).Where("account = ?", account).Order("id").Find(&out).Error
	for i := range out {
		out[i].CreatedAt = out[i].CreatedAt.UTC()
	}
	return out, err
}

func (r *gormRepo) findOrder(ctx context.Context, account string, id int64) (*Order, error) {
	var o Order
	err := r.db.WithContext(ctx).Where("account = ? AND id = ?", account, id).Take(&o).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, errNotFound
	}
	return &o, err
}

func (r *gormRepo) insertCharge(ctx context.Context, ch *Charge) (*Charge, error) {
	db := r.db.WithContext(ctx)
	if err := db.Clauses(clause.OnConflict{DoNothing: true}).Create(ch).Error; err != nil {
		return nil, err
	}
	var got Charge
	err := db.Where("provider_charge_id = ?", ch.ProviderChargeID).Take(&got).Error
	got.CreatedAt = got.CreatedAt.UTC()
	return &got, err
}
