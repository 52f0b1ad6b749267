// Package examples holds runnable example services for idem. Its own test
// (clientlease_test.go) runs a default idemclient against the engine
// through a crash inside a leased attempt, in a testing/synctest bubble;
// the tests against the built service are in examples/e2e.
package examples
