package main

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/idemkit/idem/examples/benchrig"
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
		// The simulated payment provider's own storage: one charge per
		// downstream idempotency key.
		`CREATE TABLE IF NOT EXISTS provider_charges (idem_key VARCHAR(64) NOT NULL PRIMARY KEY,
			charge_id VARCHAR(64) NOT NULL, account ` + text + ` NOT NULL, order_id BIGINT NOT NULL, amount_cents BIGINT NOT NULL)`,
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
	var out []Order
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

// insertIgnore is "insert unless the unique key exists" per dialect.
func insertIgnore(dialect, table, cols string, n int) string {
	ph := strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
	if dialect == "mysql" {
		return `INSERT IGNORE INTO ` + table + ` (` + cols + `) VALUES (` + ph + `)`
	}
	return rebind(dialect, `INSERT INTO `+table+` (`+cols+`) VALUES (`+ph+`) ON CONFLICT DO NOTHING`)
}

func (r *sqlRepo) insertCharge(ctx context.Context, ch *Charge) (*Charge, error) {
	c := r.conn(ctx)
	if _, err := c.ExecContext(ctx, insertIgnore(r.dialect, "charges", "order_id, account, amount_cents, provider_charge_id, created_at", 5),
		ch.OrderID, ch.Account, ch.AmountCents, ch.ProviderChargeID, ch.CreatedAt); err != nil {
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
	var out []Order
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

// --- the simulated payment provider -----------------------------------------

// provider is the simulated payment provider: another system, with its
// own storage (the table provider_charges, here in the service's
// database), whose writes never join the request's transaction. It
// creates a charge once per idempotency key and returns the first
// charge's id for a repeated key. The order id travels as the charge's
// metadata, as real providers allow.
type provider struct {
	db      *sql.DB
	dialect string
}

// providerRecord is what the provider keeps per charge.
type providerRecord struct {
	ChargeID    string
	Account     string
	OrderID     int64
	AmountCents int64
}

// charge charges once per key and returns the charge's id, the same for
// a repeated key.
func (p *provider) charge(ctx context.Context, key string, c providerRecord) (string, error) {
	id := "ch_" + key[:24]
	_, err := p.db.ExecContext(ctx, insertIgnore(p.dialect, "provider_charges", "idem_key, charge_id, account, order_id, amount_cents", 5),
		key, id, c.Account, c.OrderID, c.AmountCents)
	return id, err
}

// lookup returns the charge made with key: errNotFound when there is none.
func (p *provider) lookup(ctx context.Context, key string) (*providerRecord, error) {
	var c providerRecord
	err := p.db.QueryRowContext(ctx, rebind(p.dialect, `SELECT charge_id, account, order_id, amount_cents FROM provider_charges WHERE idem_key = ?`), key).
		Scan(&c.ChargeID, &c.Account, &c.OrderID, &c.AmountCents)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errNotFound
	}
	return &c, err
}
