// Package testhook gives idem's own tests of sqlstore what sqlstore does
// not publish: sqlstore/dbtest, a module of its own for its database
// drivers, cannot reach sqlstore's unexported names, and internal/ keeps
// this package from every other module. sqlstore sets it when it is
// initialised.
package testhook

// WithoutRegistry returns a sqlstore.Option that makes every claim ask
// the database, as a claim from another process does, instead of first
// answering a duplicate of an id that one of the store's own open
// transactions holds from its registry of in-flight ids. The answers are
// the same, only slower: the conformance suite runs every store both
// ways.
var WithoutRegistry func() any
