module github.com/idemkit/idem/gormstore

go 1.25

require github.com/idemkit/idem v0.0.0

replace github.com/idemkit/idem => ../
