module github.com/idemkit/idem/echo5idem

go 1.25.0

require (
	github.com/idemkit/idem v0.0.0
	github.com/labstack/echo/v5 v5.4.4
)

require golang.org/x/time v0.15.0 // indirect

replace github.com/idemkit/idem => ../
