package main

import (
	"context"

	"github.com/idemkit/idem/pgxstore"
)

// --- native pgx (-store pgx, -db postgres) ---------------------------------

// pgxRepo writes what must commit with the key row on the pgx.Tx that
// pgxstore keeps in the request's context; everything else is the
// database/sql repo's on the same pool (stdlib.OpenDBFromPool).
type pgxRepo struct{ *sqlRepo }

func (r pgxRepo) insertOrder(ctx context.Context, o *Order) error {
	tx := pgxstore.TxFrom(ctx)
	if tx == nil {
		return r.sqlRepo.insertOrder(ctx, o)
	}
	return tx.QueryRow(ctx, `INSERT INTO orders (account, item, quantity, created_at) VALUES ($1, $2, $3, $4) RETURNING id`,
		o.Account, o.Item, o.Quantity, o.CreatedAt).Scan(&o.ID)
}

func (r pgxRepo) insertCharge(ctx context.Context, ch *Charge) (*Charge, error) {
	tx := pgxstore.TxFrom(ctx)
	if tx == nil {
		return r.sqlRepo.insertCharge(ctx, ch)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, account, amount_cents, provider_charge_id, created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		ch.OrderID, ch.Account, ch.AmountCents, ch.ProviderChargeID, ch.CreatedAt); err != nil {
		return nil, err
	}
	var got Charge
	err := tx.QueryRow(ctx, `SELECT id, order_id, account, amount_cents, provider_charge_id, created_at FROM charges WHERE provider_charge_id = $1`, ch.ProviderChargeID).
		Scan(&got.ID, &got.OrderID, &got.Account, &got.AmountCents, &got.ProviderChargeID, &got.CreatedAt)
	got.CreatedAt = got.CreatedAt.UTC()
	return &got, err
}
