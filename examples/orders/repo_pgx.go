package main

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/pgxstore"
)

// --- native pgx (-store pgx, -db postgres) ---------------------------------

// pgxRepo writes what must commit with the key row on the pgx.Tx that
// pgxstore keeps in the request's context; its reads, which never join a
// transaction, are the database/sql repo's on the same pool
// (stdlib.OpenDBFromPool).
type pgxRepo struct {
	*sqlRepo
	pool *pgxpool.Pool
}

// pgxConn is what the repo writes on: the pool or a pgx.Tx.
type pgxConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
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

func (r *pgxRepo) insertOrder(ctx context.Context, o *Order) error {
	return r.conn(ctx).QueryRow(ctx, `INSERT INTO orders (account, item, quantity, created_at) VALUES ($1, $2, $3, $4) RETURNING id`,
		o.Account, o.Item, o.Quantity, o.CreatedAt).Scan(&o.ID)
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
