package main

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/pgxstore"
)

// --- native pgx (-store pgx, -db postgres) ---------------------------------

type pgxRepo struct{ pool *pgxpool.Pool }

// pgxConn is what the repo runs statements on: the pool or a pgx.Tx.
type pgxConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// conn is the middleware's transaction when there is one (atomic mode),
// else the pool.
func (r *pgxRepo) conn(ctx context.Context) pgxConn {
	if tx := pgxstore.TxFrom(ctx); tx != nil {
		return tx
	}
	return r.pool
}

func (r *pgxRepo) migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(7308150817447313517)`); err != nil {
			return err
		}
		for _, stmt := range schema("postgres") {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
}

func (r *pgxRepo) insertOrder(ctx context.Context, o *Order) error {
	return r.conn(ctx).QueryRow(ctx, `INSERT INTO orders (account, item, quantity, created_at) VALUES ($1, $2, $3, $4) RETURNING id`,
		o.Account, o.Item, o.Quantity, o.CreatedAt).Scan(&o.ID)
}

func (r *pgxRepo) listOrders(ctx context.Context, account string) ([]Order, error) {
	rows, err := r.conn(ctx).Query(ctx, `SELECT id, account, item, quantity, created_at FROM orders WHERE account = $1 ORDER BY id`, account)
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

func (r *pgxRepo) findOrder(ctx context.Context, account string, id int64) (*Order, error) {
	var o Order
	err := r.conn(ctx).QueryRow(ctx, `SELECT id, account, item, quantity, created_at FROM orders WHERE account = $1 AND id = $2`, account, id).
		Scan(&o.ID, &o.Account, &o.Item, &o.Quantity, &o.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errNotFound
	}
	o.CreatedAt = o.CreatedAt.UTC()
	return &o, err
}

func (r *pgxRepo) insertCharge(ctx context.Context, ch *Charge) (*Charge, error) {
	c := r.conn(ctx)
	if _, err := c.Exec(ctx, `INSERT INTO charges (order_id, account, amount_cents, provider_charge_id, created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		ch.OrderID, ch.Account, ch.AmountCents, ch.ProviderChargeID, ch.CreatedAt); err != nil {
		return nil, err
	}
	var got Charge
	err := c.QueryRow(ctx, `SELECT id, order_id, account, amount_cents, provider_charge_id, created_at FROM charges WHERE provider_charge_id = $1`, ch.ProviderChargeID).
		Scan(&got.ID, &got.OrderID, &got.Account, &got.AmountCents, &got.ProviderChargeID, &got.CreatedAt)
	got.CreatedAt = got.CreatedAt.UTC()
	return &got, err
}

func (r *pgxRepo) providerCharge(ctx context.Context, key string, p providerRecord) (string, error) {
	if _, err := r.pool.Exec(ctx, `INSERT INTO provider_charges (idem_key, charge_id, account, order_id, amount_cents) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		key, "ch_"+key[:24], p.Account, p.OrderID, p.AmountCents); err != nil {
		return "", err
	}
	var id string
	err := r.pool.QueryRow(ctx, `SELECT charge_id FROM provider_charges WHERE idem_key = $1`, key).Scan(&id)
	return id, err
}

func (r *pgxRepo) providerLookup(ctx context.Context, key string) (*providerRecord, error) {
	var p providerRecord
	err := r.pool.QueryRow(ctx, `SELECT charge_id, account, order_id, amount_cents FROM provider_charges WHERE idem_key = $1`, key).
		Scan(&p.ChargeID, &p.Account, &p.OrderID, &p.AmountCents)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errNotFound
	}
	return &p, err
}

// pgxTx begins the unprotected route's transaction on the pool.
func pgxTx(pool *pgxpool.Pool) txBeginner {
	return func(ctx context.Context) (context.Context, func() error, func() error, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		return pgxstore.WithTx(ctx, tx), func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }, nil
	}
}

// openPGX is the pgx backend: a pgxpool of maxConns connections, pgxstore
// on it, and the business repo on the same pool.
func openPGX(ctx context.Context, db, dsn string) (*backend, error) {
	if db != "postgres" {
		return nil, errors.New("-store pgx needs -db postgres")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	cfg.MinConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	st, err := pgxstore.New(pool)
	if err == nil {
		err = st.Migrate(ctx)
	}
	if err == nil {
		err = st.Check(ctx) // see openSQL
	}
	r := &pgxRepo{pool: pool}
	if err == nil {
		err = r.migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &backend{store: st, repo: r, begin: pgxTx(pool), close: pool.Close}, nil
}
