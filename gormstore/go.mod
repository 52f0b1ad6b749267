// idem release: published, tagged with every release (docs/releasing.md).
module github.com/idemkit/idem/gormstore

go 1.25.0

require (
	github.com/idemkit/idem v0.1.0
	github.com/idemkit/idem/sqlstore v0.1.0
	gorm.io/gorm v1.31.2
)

require (
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	golang.org/x/text v0.20.0 // indirect
)
