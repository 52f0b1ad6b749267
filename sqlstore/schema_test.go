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
// build the same table: migrations/<dialect> in golang-migrate's layout
// (an up and a down file per version), migrations/goose/<dialect> in
// goose's (one annotated file per version). The migrations module runs
// both tools on them.
func TestMigrationFilesMatchSchema(t *testing.T) {
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		for path, want := range map[string]string{
			filepath.Join("migrations", d.String(), "0001_idempotency_records.up.sql"):   Schema(d, DefaultTable),
			filepath.Join("migrations", d.String(), "0001_idempotency_records.down.sql"): dropSchema(d, DefaultTable),
			filepath.Join("migrations", "goose", d.String(), "00001_idempotency_records.sql"): "-- +goose Up\n" + Schema(d, DefaultTable) +
				"\n-- +goose Down\n" + dropSchema(d, DefaultTable),
			filepath.Join("migrations", d.String(), "0002_idempotency_marks.up.sql"):   MarksSchema(d, DefaultTable),
			filepath.Join("migrations", d.String(), "0002_idempotency_marks.down.sql"): dropMarks(DefaultTable),
			filepath.Join("migrations", "goose", d.String(), "00002_idempotency_marks.sql"): "-- +goose Up\n" + MarksSchema(d, DefaultTable) +
				"\n-- +goose Down\n" + dropMarks(DefaultTable),
		} {
			dir := filepath.Dir(path)
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
