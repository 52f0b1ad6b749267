module github.com/idemkit/idem/chiidem

go 1.25.0

require github.com/idemkit/idem v0.0.0

require github.com/go-chi/chi/v5 v5.5.0

replace github.com/idemkit/idem => ../
