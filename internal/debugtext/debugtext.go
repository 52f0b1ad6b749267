// Package debugtext cleans the debug copies of a record's caller, scope
// and key (store.Record), for the engine and for the stores that are
// called without it (the conformance suites call a store directly).
package debugtext

import (
	"strings"
	"unicode/utf8"
)

// Max is the most bytes a debug copy keeps (store.MaxDebugLen).
const Max = 255

// Clean returns s as valid UTF-8 without NUL bytes (which Postgres text
// refuses), of at most Max bytes, cut at a rune boundary.
func Clean(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if len(s) <= Max {
		return s
	}
	s = s[:Max]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
