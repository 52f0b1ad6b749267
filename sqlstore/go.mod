// idem release: published, tagged with every release (docs/releasing.md).
module github.com/idemkit/idem/sqlstore

go 1.25.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idemkit/idem v0.1.0
)

require filippo.io/edwards25519 v1.2.0 // indirect
