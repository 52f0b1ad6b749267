module github.com/idemkit/idem

go 1.25.0
