// idem release: published, tagged with every release (docs/releasing.md).
module github.com/idemkit/idem/echo5idem

go 1.25.0

require (
	github.com/idemkit/idem v0.1.0
	github.com/labstack/echo/v5 v5.4.4
)

require golang.org/x/time v0.15.0 // indirect
