module github.com/idemkit/idem/sqlstore

go 1.25

require github.com/idemkit/idem v0.0.0

replace github.com/idemkit/idem => ../
