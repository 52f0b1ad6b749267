package core

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestKeyFrom(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLen)
	tests := []struct {
		name   string
		values []string
		want   string
		err    bool
	}{
		{"ok, absent header gives no key", nil, "", false},
		{"ok, raw key", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", false},
		{"ok, quoted key addresses the same key", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", false},
		{"ok, surrounding whitespace is trimmed", []string{"  abc \t"}, "abc", false},
		{"ok, quoted escapes", []string{`"a\"b\\c"`}, `a"b\c`, false},
		{"ok, quoted key with a comma", []string{`"a,b"`}, "a,b", false},
		{"ok, 255 bytes", []string{long}, long, false},
		{"ok, 255 bytes quoted", []string{`"` + long + `"`}, long, false},
		{"nok, two header fields", []string{"a", "b"}, "", true},
		{"nok, empty value", []string{""}, "", true},
		{"nok, whitespace only", []string{"   "}, "", true},
		{"nok, empty quoted string", []string{`""`}, "", true},
		{"nok, blank quoted string", []string{`"  "`}, "", true},
		{"nok, 256 bytes", []string{long + "k"}, "", true},
		{"nok, 256 bytes quoted", []string{`"` + long + `k"`}, "", true},
		{"nok, control character", []string{"a\x01b"}, "", true},
		{"nok, DEL", []string{"a\x7fb"}, "", true},
		{"nok, unterminated quote", []string{`"abc`}, "", true},
		{"nok, bad escape", []string{`"a\nb"`}, "", true},
		{"nok, unescaped quote inside", []string{`"a"b"`}, "", true},
		{"nok, non-ASCII inside quotes", []string{"\"caf\u00e9\""}, "", true},
		{"nok, raw key with a comma (two joined fields)", []string{"a, b"}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.values != nil {
				h[HeaderKey] = tt.values
			}
			got, err := keyFrom(h, HeaderKey)
			if tt.err {
				if !errors.Is(err, ErrInvalidKey) {
					t.Fatalf("keyFrom(%q) = %q, %v; want ErrInvalidKey", tt.values, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("keyFrom(%q) = %q, %v; want %q", tt.values, got, err, tt.want)
			}
		})
	}
}
