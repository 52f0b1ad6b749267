// The README's quick starts made whole, as a user's module: not in go.work,
// not an idem module. scripts/outside-in.sh copies it out of the repository,
// runs go get for every published idem module at the release's version,
// go mod tidy, and builds it (docs/releasing.md). The requirements below are
// the drivers a user brings; the idem modules come from go get.
module example.com/quickstart

go 1.26.0

require (
	github.com/glebarez/sqlite v1.11.0
	modernc.org/sqlite v1.62.0
)
