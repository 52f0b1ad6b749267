package sqlstore

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the files in migrations/ from Schema")

// The shipped migration files are exactly what Schema and the store's
// Migrate produce for the default table, so a migration tool and Migrate
// build the same table.
func TestMigrationFilesMatchSchema(t *testing.T) {
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		dir := filepath.Join("migrations", d.String())
		for name, want := range map[string]string{
			"0001_idempotency_records.up.sql":   Schema(d, DefaultTable),
			"0001_idempotency_records.down.sql": dropSchema(d, DefaultTable),
		} {
			path := filepath.Join(dir, name)
			if *update {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Errorf("%s differs from Schema(%v, %q); run go test -run TestMigrationFilesMatchSchema -update", path, d, DefaultTable)
			}
		}
	}
}

func TestWithTableValidates(t *testing.T) {
	for _, name := range []string{"", "1abc", "a-b", "a.b", "a b", "x;drop", "ä", "a234567890123456789012345678901234567890123456789"} {
		if err := WithTable(name).apply(&Store{}); err == nil {
			t.Errorf("WithTable(%q) accepted", name)
		}
	}
}
