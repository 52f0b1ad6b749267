package sqlstore

// WithoutRegistry makes every claim of the store ask the database, as a
// claim from another process does (tests only: the registry of in-flight
// ids must change nothing but latency).
func WithoutRegistry() Option {
	return optionFunc(func(s *Store) error {
		s.noRegistry = true
		return nil
	})
}
