// Package ginbench compares the cost of fiberidem on Fiber with the cost
// of ginidem on Gin, on the same route, in one run (bench_test.go). It is
// a module of its own so that neither adapter's module requires the other
// framework; it is never released.
package ginbench
