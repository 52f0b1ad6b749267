package debugtext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	for _, tt := range []struct{ name, in, want string }{
		{"ok, kept as it is", "acct-1", "acct-1"},
		{"ok, invalid UTF-8 replaced", "a\xffb", "a\uFFFDb"},
		{"ok, NUL replaced", "a\x00b", "a\uFFFDb"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Clean(tt.in); got != tt.want {
				t.Fatalf("Clean(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
	t.Run("ok, cut at a rune boundary within Max", func(t *testing.T) {
		s := Clean(strings.Repeat("é", 200)) // 400 bytes
		if len(s) > Max || !utf8.ValidString(s) || len(s) < Max-1 {
			t.Fatalf("Clean cut a rune or overflowed: len %d", len(s))
		}
	})
}
