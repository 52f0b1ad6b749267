package dbtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// TestCheck: Check passes on a migrated table and fails with core.ErrConfig
// naming the fix when the table is missing or lacks a column, on every
// database.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	wantConfigError := func(t *testing.T, err error, parts ...string) {
		t.Helper()
		if !errors.Is(err, core.ErrConfig) {
			t.Fatalf("Check: %v, want core.ErrConfig", err)
		}
		t.Logf("Check: %v", err)
		for _, p := range parts {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("Check: %q does not say %q", err, p)
			}
		}
	}
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Run("Migrated", func(t *testing.T) {
				s, _, _ := newStore(t, d)
				if err := s.Check(ctx); err != nil {
					t.Fatalf("Check on a migrated table: %v", err)
				}
			})
			t.Run("MissingTable", func(t *testing.T) {
				db, _ := openGorm(t, d)
				s, err := gormstore.New(db, gormstore.WithTable(sqlstoretest.Table()))
				if err != nil {
					t.Fatal(err)
				}
				wantConfigError(t, s.Check(ctx), s.Table(), "store.Migrate(ctx)")
			})
			t.Run("MissingColumn", func(t *testing.T) {
				s, db, _ := newStore(t, d)
				if err := db.Exec("ALTER TABLE " + s.Table() + " DROP COLUMN fingerprint").Error; err != nil {
					t.Fatal(err)
				}
				wantConfigError(t, s.Check(ctx), "lacks the column(s) fingerprint")
			})
		})
	}
}
