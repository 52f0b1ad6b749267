// Package store is idem's store SPI: what a store implements and what
// the engine (package core) asks of it. An application does not import
// it to protect a route; a store author, a resolver (which reads a
// Record) and an operator's tool (which parses an ID) do.
//
//   - Store is the contract every store meets, method by method; TxStore
//     joins a database transaction (atomic mode), Settler keeps the marks
//     of records a core.Completer settles without a client, Inspector
//     lists records for an operator, MultiPrimary tells a multi-primary
//     cluster apart.
//   - Record, ID and State are a stored record (Identity.ID makes the ID
//     of a caller, scope and key); ClaimRequest, ClaimResult and
//     Completion are what Claim and Complete take and give.
//
// Stores return the sentinel errors of package core (core.ErrNotFound,
// core.ErrFenced, core.ErrStoreUnavailable, core.ErrTxAborted,
// core.ErrLostRace), wrapped with %w; package storetest is the
// conformance suite every store runs:
//
//	var _ store.TxStore = (*Store)(nil)
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return newStore(t) })
//	}
//
// This package depends on the standard library only, and not on package
// core: core imports it.
package store
