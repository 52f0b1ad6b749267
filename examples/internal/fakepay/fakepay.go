// Package fakepay is the simulated payment provider of the example service
// (examples/orders): another system, with its own storage (the table
// provider_charges, here in the service's database), whose writes never
// join the request's transaction. It creates a charge once per
// idempotency key and answers a repeated key with the first charge. The
// order id travels as the charge's metadata, as real providers allow.
package fakepay

import (
	"context"
	"database/sql"
	"errors"
)

// ErrNoCharge is Lookup's error for a key nothing was charged with.
var ErrNoCharge = errors.New("fakepay: no charge with this key")

// Charge is what the provider keeps per charge.
type Charge struct {
	ID          string
	Account     string
	OrderID     int64
	AmountCents int64
}

// Provider is the provider on a database/sql pool.
type Provider struct {
	db      *sql.DB
	dialect string // sqlite, postgres or mysql
}

// New is the provider on db, whose table Schema created.
func New(db *sql.DB, dialect string) *Provider { return &Provider{db: db, dialect: dialect} }

// Schema is the statement that creates the provider's table, for the
// service to run with its own (text is the dialect's string column type).
func Schema(text string) string {
	return `CREATE TABLE IF NOT EXISTS provider_charges (idem_key VARCHAR(64) NOT NULL PRIMARY KEY,
			charge_id VARCHAR(64) NOT NULL, account ` + text + ` NOT NULL, order_id BIGINT NOT NULL, amount_cents BIGINT NOT NULL)`
}

// Charge charges once per key and returns the charge's id, the same for a
// repeated key.
func (p *Provider) Charge(ctx context.Context, key string, c Charge) (string, error) {
	id := "ch_" + key[:24]
	q := `INSERT INTO provider_charges (idem_key, charge_id, account, order_id, amount_cents) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`
	switch p.dialect {
	case "mysql":
		q = `INSERT IGNORE INTO provider_charges (idem_key, charge_id, account, order_id, amount_cents) VALUES (?, ?, ?, ?, ?)`
	case "postgres":
		q = `INSERT INTO provider_charges (idem_key, charge_id, account, order_id, amount_cents) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`
	}
	_, err := p.db.ExecContext(ctx, q, key, id, c.Account, c.OrderID, c.AmountCents)
	return id, err
}

// Lookup returns the charge made with key: ErrNoCharge when there is none.
func (p *Provider) Lookup(ctx context.Context, key string) (*Charge, error) {
	q := `SELECT charge_id, account, order_id, amount_cents FROM provider_charges WHERE idem_key = ?`
	if p.dialect == "postgres" {
		q = `SELECT charge_id, account, order_id, amount_cents FROM provider_charges WHERE idem_key = $1`
	}
	var c Charge
	err := p.db.QueryRowContext(ctx, q, key).Scan(&c.ID, &c.Account, &c.OrderID, &c.AmountCents)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNoCharge
	}
	return &c, err
}
