package pgxstore

import "sync"

// WithoutRegistry makes every claim of the store ask the database, as a
// claim from another process does (tests only).
func WithoutRegistry() Option {
	return optionFunc(func(s *Store) error {
		s.noRegistry = true
		return nil
	})
}

// HoldRollbacks makes the store's background rollbacks wait until release
// is called, and wait for them all to end; set it before any request.
func HoldRollbacks(s *Store) (release, wait func()) {
	gate := make(chan struct{})
	s.rollbackGate = gate
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }, s.bg.Wait
}
