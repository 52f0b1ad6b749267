// Package storeutil holds what the SQL stores (sqlstore, pgxstore) check
// and clean the same way: table names and the record's debug strings.
package storeutil

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/idem/core"
)

// MaxTableLen keeps "<table>_expires_at_idx" within Postgres' 63-byte
// identifier limit.
const MaxTableLen = 48

// ValidTable checks a table name for pkg's WithTable ("sqlstore",
// "pgxstore"): 1 to MaxTableLen bytes of ASCII letters, digits and
// underscores, not starting with a digit (it is used unquoted). The error
// wraps core.ErrConfig.
func ValidTable(pkg, name string) error {
	if name == "" || len(name) > MaxTableLen {
		return fmt.Errorf("%w: %s: table name must be 1 to %d bytes, got %q", core.ErrConfig, pkg, MaxTableLen, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return fmt.Errorf("%w: %s: table name %q: only letters, digits and underscores, not starting with a digit", core.ErrConfig, pkg, name)
		}
	}
	return nil
}

// DebugString returns s as valid UTF-8 without NUL bytes (which Postgres
// text refuses), of at most core.MaxDebugLen bytes.
func DebugString(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if len(s) <= core.MaxDebugLen {
		return s
	}
	s = s[:core.MaxDebugLen]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
