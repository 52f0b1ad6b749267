// idem release: published, tagged with every release (docs/releasing.md).
module github.com/idemkit/idem/chiidem

go 1.25.0

require github.com/idemkit/idem v0.1.0

require github.com/go-chi/chi/v5 v5.5.0
