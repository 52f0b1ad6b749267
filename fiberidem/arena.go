package fiberidem

import "unsafe"

// arena copies the bytes of many short strings (header names and values)
// into few allocations: a chunk is filled, then a new one taken. Bytes
// handed out are never written again and a chunk never moves, so the
// strings it returns stay valid and immutable, as strings.Builder's do.
type arena struct{ buf []byte }

func newArena(size int) arena { return arena{buf: make([]byte, 0, max(size, 64))} }

// room returns where n more bytes go: the current chunk, or a new one.
func (a *arena) room(n int) {
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, max(n, 2*cap(a.buf)))
	}
}

// str returns a string holding a copy of b.
func (a *arena) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	a.room(len(b))
	start := len(a.buf)
	a.buf = append(a.buf, b...)
	return unsafe.String(&a.buf[start], len(b))
}

// canonicalKey is str for a header name, in the canonical form net/http
// gives request header names (textproto.CanonicalMIMEHeaderKey: "x-caller"
// becomes "X-Caller"; a name with a byte that is not a token character is
// kept as it is), so that Header.Get finds it whatever the client sent and
// whether or not the app disables Fiber's normalizing.
func (a *arena) canonicalKey(k []byte) string {
	for _, c := range k {
		if !tokenChar(c) {
			return a.str(k)
		}
	}
	if len(k) == 0 {
		return ""
	}
	a.room(len(k))
	start := len(a.buf)
	upper := true
	for _, c := range k {
		switch {
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case !upper && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		a.buf = append(a.buf, c)
		upper = c == '-'
	}
	return unsafe.String(&a.buf[start], len(k))
}

// tokenChar reports whether c may appear in a header name (RFC 9110 tchar).
func tokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
