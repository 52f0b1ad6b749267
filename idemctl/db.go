package main

import (
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // "pgx"
	_ "modernc.org/sqlite"             // "sqlite"

	"github.com/idemkit/idem/sqlstore"
)

// parseDSN tells the database of dsn (or takes db: postgres, mysql,
// sqlite) and returns the store's dialect, the database/sql driver's
// name and the DSN that driver takes.
func parseDSN(db, dsn string) (sqlstore.Dialect, string, string, error) {
	if db == "" {
		db = guess(dsn)
	}
	switch db {
	case "postgres", "postgresql", "pgx":
		return sqlstore.Postgres, "pgx", dsn, nil
	case "mysql", "mariadb":
		cfg, err := mysql.ParseDSN(strings.TrimPrefix(dsn, "mysql://"))
		if err != nil {
			return 0, "", "", fmt.Errorf("the MySQL DSN: %v (the go-sql-driver form: user:pass@tcp(host:3306)/db)", err)
		}
		// The store scans DATETIME columns as time.Time; the location
		// stays the DSN's (the store's records are UTC, the driver's
		// default).
		cfg.ParseTime = true
		return sqlstore.MySQL, "mysql", cfg.FormatDSN(), nil
	case "sqlite", "sqlite3":
		dsn = strings.TrimPrefix(dsn, "sqlite://")
		if !strings.Contains(dsn, "busy_timeout") {
			// Wait for the application's writers instead of failing with
			// SQLITE_BUSY at once.
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			dsn += sep + "_pragma=busy_timeout(5000)"
		}
		return sqlstore.SQLite, "sqlite", dsn, nil
	case "":
		return 0, "", "", fmt.Errorf("cannot tell the database from the DSN %q: give -db postgres, mysql or sqlite", redact(dsn))
	}
	return 0, "", "", fmt.Errorf("-db %q: postgres, mysql or sqlite", db)
}

// guess tells the database from the DSN's form, or returns "".
func guess(dsn string) string {
	path, _, _ := strings.Cut(dsn, "?")
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return "postgres"
	case strings.HasPrefix(dsn, "mysql://"), strings.Contains(dsn, "@tcp("), strings.Contains(dsn, "@unix("), strings.Contains(dsn, "@/"):
		return "mysql"
	case strings.HasPrefix(dsn, "sqlite://"), strings.HasPrefix(dsn, "file:"),
		strings.HasSuffix(path, ".db"), strings.HasSuffix(path, ".sqlite"), strings.HasSuffix(path, ".sqlite3"):
		return "sqlite"
	}
	return ""
}

// redact hides a password in dsn, for messages.
func redact(dsn string) string {
	if i := strings.Index(dsn, "password="); i >= 0 {
		end := strings.IndexAny(dsn[i:], " &")
		if end < 0 {
			end = len(dsn) - i
		}
		dsn = dsn[:i] + "password=***" + dsn[i+end:]
	}
	at := strings.LastIndex(dsn, "@")
	if at < 0 {
		return dsn
	}
	userinfo := dsn[:at]
	scheme := ""
	if i := strings.Index(userinfo, "://"); i >= 0 {
		scheme, userinfo = userinfo[:i+3], userinfo[i+3:]
	}
	if user, _, ok := strings.Cut(userinfo, ":"); ok {
		return scheme + user + ":***" + dsn[at:]
	}
	return dsn
}
