package gormstore

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"gorm.io/gorm"

	"github.com/idemkit/idem/core"
)

// ErrOutsideTx: a GORM write whose context carries a transaction (the one
// DB(ctx) returns: the request's in atomic mode, or one passed with WithTx)
// would run outside it, on the pool or in a transaction of its own. It
// fails before it reaches the database, with a message naming the fix. It
// wraps core.ErrConfig.
var ErrOutsideTx = fmt.Errorf("%w: gormstore: a write would run outside the transaction its context carries", core.ErrConfig)

const (
	pluginName   = "idem"    // the plugin's name in gorm.Config.Plugins
	callbackName = "idem:tx" // the callback New and Plugin register
)

// Plugin returns the GORM plugin that makes the application's own
// *gorm.DB join the transaction a context carries:
//
//	db.Use(gormstore.Plugin())
//
// With it, every statement run with a context (db.WithContext(ctx)...)
// whose context carries a transaction of the same database (the one
// DB(ctx) returns: the request's in middleware-managed atomic mode, or one
// passed with WithTx) runs in that transaction. A repository that knows
// nothing of idem (r.db.WithContext(ctx).Create(&order)) then commits or
// rolls back with the key row, and reads its own writes. Statements
// without such a context, with a context from Store.WithoutTx (the
// transaction hidden), or on another database (another *sql.DB) run as
// they would without the plugin.
//
// A transaction the application opens itself with such a context
// (db.WithContext(ctx).Transaction(...), db.WithContext(ctx).Begin(), GORM
// for CreateInBatches of more rows than one batch) joins the request's as
// GORM joins a nested transaction: a savepoint in it. Its commit releases
// the savepoint, its rollback rolls back to it (its writes alone; on
// Postgres a failed statement in it no longer aborts the request's
// transaction), and the claim and the completion are untouched. A
// repository that manages its own transactions needs no change.
//
// The transaction is one connection: statements with its context must not
// run concurrently (goroutines of one handler); see the README.
//
// Without the plugin, New's callback still finds such writes: every
// create, update, delete and Exec whose context carries a transaction but
// runs outside it fails with ErrOutsideTx (so does raw SQL that starts
// with INSERT, UPDATE, DELETE, REPLACE or MERGE, run with Raw(...).Scan or
// Rows), and reads run as they are.
func Plugin() gorm.Plugin { return plugin{} }

type plugin struct{}

func (plugin) Name() string { return pluginName }

func (plugin) Initialize(db *gorm.DB) error {
	if _, ok := db.ConnPool.(joiningPool); !ok {
		// A repository's own transaction joins the request's (join.go).
		// gorm.Open copied the pool into the root statement too.
		db.ConnPool = joiningPool{db.ConnPool}
		if db.Statement != nil && db.Statement.ConnPool == db.ConnPool.(joiningPool).ConnPool {
			db.Statement.ConnPool = db.ConnPool
		}
	}
	return register(db)
}

// register adds the callback that joins (Plugin installed) or guards (not
// installed) the transaction of a statement's context to every processor
// of db's callbacks, first in each, once per set of callbacks.
func register(db *gorm.DB) error {
	cb := db.Callback()
	if cb.Create().Get(callbackName) != nil {
		return nil
	}
	return errors.Join(
		cb.Create().Before("*").Register(callbackName, inTx(true)),
		cb.Update().Before("*").Register(callbackName, inTx(true)),
		cb.Delete().Before("*").Register(callbackName, inTx(true)),
		cb.Raw().Before("*").Register(callbackName, inTx(true)), // Exec
		cb.Query().Before("*").Register(callbackName, inTx(false)),
		cb.Row().Before("*").Register(callbackName, inTx(false)), // Row, Rows, Scan; writes in raw SQL too (rawWrite)
	)
}

// inTx returns the callback for a processor whose statements write (or
// only read). When the statement's context carries a transaction (liveTx:
// not one the engine has committed or rolled back) on the statement's
// database and the statement does not run in it: with
// the plugin installed, a statement on the pool is moved into it; a write
// that stays outside (no plugin, or a transaction of its own) fails with
// ErrOutsideTx before it reaches the database.
func inTx(write bool) func(*gorm.DB) {
	return func(db *gorm.DB) {
		stmt := db.Statement
		if db.Error != nil || stmt.Context == nil {
			return
		}
		tx := liveTx(stmt.Context)
		if tx == nil || sameConn(stmt.ConnPool, tx.Statement.ConnPool) || !sameDB(db, tx) {
			return
		}
		_, ownTx := stmt.ConnPool.(gorm.TxCommitter)
		if _, join := db.Plugins[pluginName]; join && !ownTx {
			stmt.ConnPool = tx.Statement.ConnPool
			return
		}
		if !write && !rawWrite(stmt) {
			return
		}
		if ownTx {
			_ = db.AddError(fmt.Errorf("%w, in a transaction of its own (db.Transaction, db.Begin, or CreateInBatches of more than one batch, with the request's context): "+
				"it would not commit or roll back with the request's; open it with gormstore.DB(ctx).Transaction(...) (a savepoint in the request's transaction), "+
				"or give it a context without the request's transaction (store.WithoutTx(ctx)) if it must commit on its own", ErrOutsideTx))
			return
		}
		_ = db.AddError(fmt.Errorf("%w, on the connection pool (or a connection of its own, db.Connection): install the plugin so that the application's *gorm.DB joins it (db.Use(gormstore.Plugin())), "+
			"or write through gormstore.DB(ctx); give it a context without the request's transaction (store.WithoutTx(ctx)) if it must commit on its own", ErrOutsideTx))
	}
}

// sameConn reports whether two connection pools of GORM statements are
// the same transaction (seen through GORM's prepared-statement wrapper).
func sameConn(a, b gorm.ConnPool) bool {
	return unwrapConn(a) == unwrapConn(b)
}

func unwrapConn(p gorm.ConnPool) gorm.ConnPool {
	for {
		switch v := p.(type) {
		case *gorm.PreparedStmtTX:
			p = v.Tx
		case *savepointPool:
			p = v.ConnPool // a repository's transaction joined to the request's
		default:
			return p
		}
	}
}

// sameDB reports whether the statement db and the transaction tx run on
// one database (the same *sql.DB). A statement on a connection of its own
// (db.Connection: a *sql.Conn, which does not tell its *sql.DB) runs on
// the database of db's own pool.
func sameDB(db, tx *gorm.DB) bool {
	a, err := db.DB()
	if _, ok := db.Statement.ConnPool.(*sql.Conn); ok && err != nil {
		a, err = (&gorm.DB{Config: db.Config}).DB()
	}
	if err != nil {
		return false
	}
	b, err := tx.DB()
	return err == nil && a == b
}

// rawWrite reports whether stmt is raw SQL that writes
// (db.Raw("INSERT ... RETURNING id").Scan(&id)): Raw builds its SQL before
// the callbacks run, and it starts with a writing verb. A statement GORM
// builds itself (Find, Rows on a model) has no SQL yet. Raw writes that
// start otherwise (WITH ... INSERT) are not recognised.
func rawWrite(stmt *gorm.Statement) bool {
	verb := strings.TrimSpace(stmt.SQL.String())
	if i := strings.IndexFunc(verb, unicode.IsSpace); i >= 0 {
		verb = verb[:i]
	}
	switch strings.ToUpper(verb) {
	case "INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE":
		return true
	}
	return false
}
