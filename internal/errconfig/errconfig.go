// Package errconfig holds the one invalid-configuration sentinel, so that
// package core (core.ErrConfig) and the store SPI it imports (core/store:
// ParseID, ParseState, ParseCursor, ListQuery.Check) wrap the same value
// without core/store importing core.
package errconfig

import "errors"

// Err is core.ErrConfig.
var Err = errors.New("idem: invalid configuration")
