package main

import (
	"bytes"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunOnAPortInUse: a start-up error after the sweeper has started (the
// listen address is taken) comes back from run as the real error, without
// a panic, for every store.
func TestRunOnAPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, store := range []string{"sql", "gorm"} {
		t.Run(store, func(t *testing.T) {
			for i := range 20 { // the old race needed a few tries
				var logs bytes.Buffer
				o := options{
					addr: ln.Addr().String(), framework: "chi", store: store, db: "sqlite",
					dsn:        filepath.Join(t.TempDir(), "orders.db"),
					sweepEvery: time.Minute, lease: 30 * time.Second, retention: time.Hour,
				}
				err := run(o, slog.New(slog.NewTextHandler(&logs, nil)))
				if err == nil {
					t.Fatalf("run %d on a port in use returned nil", i)
				}
				if !strings.Contains(err.Error(), "address already in use") {
					t.Fatalf("run %d: error %q does not say the address is in use", i, err)
				}
			}
		})
	}
}

// TestRunWithoutDSN: -db postgres or mysql without -dsn, or with a MySQL
// DSN the driver cannot parse, stops the start with a message that names
// the fix (and no "<nil>" where a cause would be).
func TestRunWithoutDSN(t *testing.T) {
	for _, c := range []struct{ store, db, dsn, want string }{
		{"sql", "postgres", "", "-db postgres needs -dsn"},
		{"sql", "mysql", "", "-db mysql needs -dsn"},
		{"gorm", "mysql", "", "-db mysql needs -dsn"},
		{"sql", "mysql", "no-slash", "-db mysql needs -dsn"},
		{"pgx", "postgres", "", "-store pgx needs -db postgres and -dsn"},
	} {
		t.Run(c.store+"/"+c.db+"/"+c.dsn, func(t *testing.T) {
			o := options{addr: "127.0.0.1:0", framework: "chi", store: c.store, db: c.db, dsn: c.dsn,
				sweepEvery: time.Minute, lease: 30 * time.Second, retention: time.Hour}
			err := run(o, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "<nil>") {
				t.Fatalf("run: error %v, want one that says %q (and no <nil>)", err, c.want)
			}
		})
	}
}
