// idem release: published, tagged with every release (docs/releasing.md).
module github.com/idemkit/idem

go 1.25.0
