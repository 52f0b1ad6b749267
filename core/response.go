package core

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/idemkit/idem/core/store"
)

// Response is a recorded response.
type Response struct {
	Status int
	// Header holds the recorded headers only (the allowlist), values in
	// order, under the spellings the handler used.
	Header http.Header
	// Body is the recorded body; nil when BodyKept is false.
	Body []byte
	// BodyKept is false when the body was over the cap or streamed (Flush,
	// Hijack): a replay then answers with Status and a problem document.
	BodyKept bool
}

// capped is resp as it is recorded: its body kept up to max bytes (past
// them the record says the body was not kept).
func capped(resp *Response, max int64) *Response {
	kept := *resp
	kept.BodyKept = int64(len(kept.Body)) <= max
	if !kept.BodyKept {
		kept.Body = nil
	}
	return &kept
}

const (
	encPlain  = 0x01 // plain encoding, version 1
	encSealed = 0x02 // sealed: see Sealer
	flagKept  = 0x01
)

var errCorrupt = errors.New("idem: corrupt recorded response")

// encodeResponse appends the binary encoding of resp to dst: version,
// flags, status (uint16), header count, then length-prefixed names and
// values, then the length-prefixed body. With a non-nil allow, only the
// listed headers (canonical names) of resp.Header are encoded, each under
// every spelling it has there (see eachAllowed).
func encodeResponse(dst []byte, resp *Response, allow []string) []byte {
	var flags byte
	if resp.BodyKept {
		flags |= flagKept
	}
	dst = append(dst, encPlain, flags)
	dst = binary.BigEndian.AppendUint16(dst, uint16(resp.Status))
	// The fields to encode, found once (counted, then written).
	var buf [8]headerField
	fields := buf[:0]
	add := func(name string, vs []string) { fields = append(fields, headerField{name, vs}) }
	if allow == nil {
		for name, vs := range resp.Header {
			add(name, vs)
		}
	} else {
		eachAllowed(resp.Header, allow, add)
	}
	n := 0
	for _, f := range fields {
		n += len(f.vs)
	}
	dst = binary.AppendUvarint(dst, uint64(n))
	for _, f := range fields {
		for _, v := range f.vs {
			dst = binary.AppendUvarint(dst, uint64(len(f.name)))
			dst = append(dst, f.name...)
			dst = binary.AppendUvarint(dst, uint64(len(v)))
			dst = append(dst, v...)
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(resp.Body)))
	return append(dst, resp.Body...)
}

// headerField is a header's name (as spelt in the map) and its values.
type headerField struct {
	name string
	vs   []string
}

// recorded is a validated plain encoding of a recorded response, read
// without copying: the header section and the body alias the encoding.
type recorded struct {
	status  int
	kept    bool
	headers int    // number of (name, value) pairs
	hdr     []byte // the pairs, length-prefixed
	body    []byte // the body; nil when kept is false
}

// uvarintField reads a length-prefixed field from b and returns it and the
// rest of b; ok is false when b is too short.
func uvarintField(b []byte) (field, rest []byte, ok bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	return b[k : k+int(n)], b[k+int(n):], true
}

// parseResponse validates a plain encoding, without allocating.
func parseResponse(b []byte) (recorded, error) {
	if len(b) < 4 || b[0] != encPlain {
		return recorded{}, errCorrupt
	}
	r := recorded{kept: b[1]&flagKept != 0, status: int(binary.BigEndian.Uint16(b[2:4]))}
	b = b[4:]
	count, k := binary.Uvarint(b)
	if k <= 0 || count > uint64(len(b)) {
		return recorded{}, errCorrupt
	}
	b = b[k:]
	hdr := b
	for range count {
		var ok bool
		if _, b, ok = uvarintField(b); !ok {
			return recorded{}, errCorrupt
		}
		if _, b, ok = uvarintField(b); !ok {
			return recorded{}, errCorrupt
		}
	}
	r.headers, r.hdr = int(count), hdr[:len(hdr)-len(b)]
	body, rest, ok := uvarintField(b)
	if !ok || len(rest) != 0 {
		return recorded{}, errCorrupt
	}
	if r.kept {
		r.body = body
	}
	return r, nil
}

// eachHeader calls f with every recorded (name, value) pair, in order.
func (r *recorded) eachHeader(f func(name, value []byte)) {
	b := r.hdr
	for range r.headers {
		name, rest, _ := uvarintField(b)
		value, rest, _ := uvarintField(rest)
		f(name, value)
		b = rest
	}
}

// response returns r as a Response (the body aliases the encoding).
func (r *recorded) response() *Response {
	resp := &Response{Status: r.status, Body: r.body, BodyKept: r.kept}
	if r.headers > 0 {
		resp.Header = make(http.Header, r.headers)
		r.eachHeader(func(name, value []byte) {
			key := string(name)
			resp.Header[key] = append(resp.Header[key], string(value))
		})
	}
	return resp
}

// decodeResponse decodes a plain encoding. The body aliases b.
func decodeResponse(b []byte) (*Response, error) {
	r, err := parseResponse(b)
	if err != nil {
		return nil, err
	}
	return r.response(), nil
}

// writeHeader sets the recorded headers in h, replacing the values h holds
// under those names, and sets extra (a canonical name) to "true". The
// value lists share one new backing array, each capped at its length, so
// that appending to one list never changes another.
func (r *recorded) writeHeader(h http.Header, extra string) {
	vals := make([]string, 0, r.headers+1)
	var name string
	first := 0 // index in vals of the first value of name
	flush := func() {
		switch {
		case len(vals) == first:
		case first > 0 && seenName(r, name, first):
			// The values of a name are normally consecutive
			// (encodeResponse writes them so); a name met again (an
			// encoding from a duplicated allowlist) adds to its values.
			h[name] = append(h[name], vals[first:]...)
		default:
			h[name] = vals[first:len(vals):len(vals)]
		}
	}
	r.eachHeader(func(n, value []byte) {
		if len(vals) == 0 || string(n) != name {
			flush()
			name, first = string(n), len(vals)
		}
		vals = append(vals, string(value))
	})
	flush()
	vals = append(vals, "true")
	h[extra] = vals[len(vals)-1:]
}

// seenName reports whether name is the name of one of the first n
// (name, value) pairs of r.
func seenName(r *recorded, name string, n int) bool {
	b := r.hdr
	for range n {
		nm, rest, _ := uvarintField(b)
		if string(nm) == name {
			return true
		}
		_, b, _ = uvarintField(rest)
	}
	return false
}

// eachAllowed calls f with the spelling and values of every key of h that
// names one of allow (canonical names), in the order of allow: the
// canonical key first, then the other spellings of the name in byte order.
// A handler may set a header under a spelling of its own by assigning to
// the map (w.Header()["ETag"], Go's documented way for a non-canonical
// name); net/http sends it so, and it is recorded and replayed so. A key
// that is not a canonical name's spelling (say "Set-Cookie" spelt
// "set-cookie" when Set-Cookie is never recorded) is never allowed.
func eachAllowed(h http.Header, allow []string, f func(name string, vs []string)) {
	// The keys under a spelling other than the canonical one are rare (a
	// handler assigning to the map): found in one pass over h, not in one
	// per allowed name. (A name with bytes a header name cannot have is
	// its own canonical spelling: net/http does not send it.)
	var buf [2]string
	others := buf[:0]
	for k := range h {
		if k != http.CanonicalHeaderKey(k) {
			others = append(others, k)
		}
	}
	slices.Sort(others)
	for _, name := range allow {
		if vs := h[name]; len(vs) > 0 {
			f(name, vs)
		}
		for _, k := range others {
			if vs := h[k]; len(vs) > 0 && k != name && asciiEqualFold(k, name) {
				f(k, vs)
			}
		}
	}
}

// asciiEqualFold reports whether a and b are equal under ASCII case
// folding: header names are ASCII tokens, and a key with other bytes never
// names an allowlisted header.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// recordedHeader copies the allowlisted headers of h, each under every
// spelling it has there (see eachAllowed).
func recordedHeader(h http.Header, allow []string) http.Header {
	var out http.Header
	eachAllowed(h, allow, func(name string, vs []string) {
		if out == nil {
			out = make(http.Header, len(allow))
		}
		out[name] = append([]string(nil), vs...)
	})
	return out
}

// sealResponse encodes resp (only the allowed headers, when allow is not
// nil) and seals it when a sealer is configured.
func (e *Engine) sealResponse(id store.ID, resp *Response, allow []string) ([]byte, error) {
	return e.sealInto(make([]byte, 0, 64+len(resp.Body)), id, resp, allow)
}

// sealInto is sealResponse encoding into dst (the plain encoding is
// appended to dst; the sealed one, with a sealer, is new memory).
func (e *Engine) sealInto(dst []byte, id store.ID, resp *Response, allow []string) ([]byte, error) {
	plain := encodeResponse(dst, resp, allow)
	if e.cfg.sealer == nil {
		return plain, nil
	}
	sealed, err := e.cfg.sealer.Seal(id, plain)
	if err != nil {
		return nil, fmt.Errorf("idem: sealing the response: %w", err)
	}
	return sealed, nil
}

// openResponse reverses sealResponse.
func (e *Engine) openResponse(id store.ID, b []byte) (recorded, error) {
	if len(b) > 0 && b[0] == encSealed {
		if e.cfg.sealer == nil {
			return recorded{}, errors.New("idem: the recorded response is sealed and no sealer is configured")
		}
		plain, err := e.cfg.sealer.Open(id, b)
		if err != nil {
			return recorded{}, err
		}
		b = plain
	}
	return parseResponse(b)
}
