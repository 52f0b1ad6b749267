package fiberidem

import "unsafe"

// arena copies the bytes of many short strings (header names and values)
// into one allocation. Its capacity is reserved up front and never grows,
// and nothing is written over bytes already handed out, so the strings it
// returns stay valid and immutable, as strings.Builder's do.
type arena struct{ buf []byte }

func newArena(size int) arena { return arena{buf: make([]byte, 0, size)} }

// str returns a string holding a copy of b. b must fit in what is left of
// the capacity reserved.
func (a *arena) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(a.buf)+len(b) > cap(a.buf) {
		panic("fiberidem: arena overflow") // a bug of the size computed
	}
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
	s := a.str(k)
	if s == "" {
		return s
	}
	b := a.buf[len(a.buf)-len(k):]
	upper := true
	for i, c := range b {
		switch {
		case upper && 'a' <= c && c <= 'z':
			b[i] = c - ('a' - 'A')
		case !upper && 'A' <= c && c <= 'Z':
			b[i] = c + ('a' - 'A')
		}
		upper = c == '-'
	}
	return s
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
