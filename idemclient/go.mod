module github.com/idemkit/idem/idemclient

go 1.25.0
