package pgxstore

// WithoutRegistry makes every claim of the store ask the database, as a
// claim from another process does (tests only).
func WithoutRegistry() Option {
	return optionFunc(func(s *Store) error {
		s.noRegistry = true
		return nil
	})
}
