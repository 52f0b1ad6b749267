// Package quickstart holds the README's quick starts (README.md, "Quick
// starts", and each module's README), made into programs that compile:
// scripts/outside-in.sh builds them outside the repository against the
// idem modules a release publishes, got through a module proxy with no
// replace line. A call renamed in a module and not here fails the release
// rehearsal. Each program is in a directory of its own (gin, echo, echo5,
// chi, gorm, sql, pgx, redis, grpc, otel, client).
package quickstart
