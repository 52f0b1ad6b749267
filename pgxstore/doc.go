// Package pgxstore is an idem store on native pgx (github.com/jackc/pgx/v5,
// a *pgxpool.Pool), for services that use pgx directly rather than
// database/sql: atomic mode with the handler's pgx.Tx, caller-managed
// transactions (WithTx), leased mode, the sweeper (DeleteExpired),
// Migrate, Check, and the database clock (Now).
//
// It keeps its records in the table of sqlstore's Postgres dialect and
// runs the same SQL (a sqlstore and a pgxstore can share one table). What
// pgx adds is pipelining: in middleware-managed atomic mode BEGIN travels
// with the claim, and the completion with COMMIT, so a protected
// transaction makes as many round trips as the unprotected one.
//
// Middleware-managed atomic mode: the handler fetches the transaction
// with Tx(r.Context()) and runs its writes on it; idem commits it with the
// recorded response. Caller-managed: code that holds a pgx.Tx passes it
// with WithTx.
package pgxstore
