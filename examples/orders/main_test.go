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
