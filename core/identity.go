package core

import (
	"crypto/sha256"
	"strings"
)

// parseKey parses one Idempotency-Key field value. Both syntaxes address
// the same key: the raw value (Idempotency-Key: abc, as Stripe clients
// send it) and the RFC 8941 sf-string (Idempotency-Key: "abc", as the
// IETF draft says). The key must be 1 to MaxKeyLen bytes after trimming
// optional whitespace, without control characters; a quoted string must
// be well formed (only \" and \\ escapes, printable ASCII). An empty value
// or any violation returns an error wrapping ErrInvalidKey.
func parseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", clientErrorf(ErrInvalidKey, "empty value")
	}
	if v[0] == '"' {
		return parseQuoted(v)
	}
	if len(v) > MaxKeyLen {
		return "", clientErrorf(ErrInvalidKey, "longer than %d bytes", MaxKeyLen)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return "", clientErrorf(ErrInvalidKey, "control character at byte %d", i)
		}
	}
	// A comma in a raw value is how a proxy would join two header fields:
	// refuse it rather than guess which one the client meant.
	if strings.IndexByte(v, ',') >= 0 {
		return "", clientErrorf(ErrInvalidKey, "a raw key cannot contain a comma (use the quoted form)")
	}
	return v, nil
}

// parseQuoted parses an RFC 8941 sf-string: DQUOTE *(unescaped / "\" (DQUOTE
// / "\")) DQUOTE, unescaped being %x20-21 / %x23-5B / %x5D-7E.
func parseQuoted(v string) (string, error) {
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", clientErrorf(ErrInvalidKey, "unterminated quoted string")
	}
	inner := v[1 : len(v)-1]
	if strings.IndexByte(inner, '\\') < 0 {
		// Fast path: no escapes.
		for i := 0; i < len(inner); i++ {
			if c := inner[i]; c < 0x20 || c > 0x7e || c == '"' {
				return "", clientErrorf(ErrInvalidKey, "invalid character in quoted string at byte %d", i+1)
			}
		}
		return checkLen(inner)
	}
	var b strings.Builder
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			i++
			if i == len(inner) || (inner[i] != '"' && inner[i] != '\\') {
				return "", clientErrorf(ErrInvalidKey, "invalid escape in quoted string")
			}
			b.WriteByte(inner[i])
		case c < 0x20 || c > 0x7e || c == '"':
			return "", clientErrorf(ErrInvalidKey, "invalid character in quoted string at byte %d", i+1)
		default:
			b.WriteByte(c)
		}
	}
	return checkLen(b.String())
}

func checkLen(k string) (string, error) {
	switch {
	case k == "" || strings.Trim(k, " ") == "":
		return "", clientErrorf(ErrInvalidKey, "empty value")
	case len(k) > MaxKeyLen:
		return "", clientErrorf(ErrInvalidKey, "longer than %d bytes", MaxKeyLen)
	}
	return k, nil
}

// normalFingerprint bounds a fingerprint to 32 bytes for the store: longer
// ones (from a custom Fingerprinter) are hashed.
func normalFingerprint(fp []byte) []byte {
	if len(fp) <= sha256.Size {
		return fp
	}
	sum := sha256.Sum256(fp)
	return sum[:]
}
