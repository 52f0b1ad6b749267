package core

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
)

// Response is a recorded response.
type Response struct {
	Status int
	// Header holds the recorded headers only (the allowlist), values in order.
	Header http.Header
	// Body is the recorded body; nil when BodyKept is false.
	Body []byte
	// BodyKept is false when the body was over the cap or streamed (Flush,
	// Hijack): a replay then answers with Status and a problem document.
	BodyKept bool
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
// listed headers (canonical names) of resp.Header are encoded.
func encodeResponse(dst []byte, resp *Response, allow []string) []byte {
	var flags byte
	if resp.BodyKept {
		flags |= flagKept
	}
	dst = append(dst, encPlain, flags)
	dst = binary.BigEndian.AppendUint16(dst, uint16(resp.Status))
	n := 0
	each := func(f func(name string, vs []string)) {
		if allow == nil {
			for name, vs := range resp.Header {
				f(name, vs)
			}
			return
		}
		for _, name := range allow {
			if vs := resp.Header[name]; len(vs) > 0 {
				f(name, vs)
			}
		}
	}
	each(func(_ string, vs []string) { n += len(vs) })
	dst = binary.AppendUvarint(dst, uint64(n))
	each(func(name string, vs []string) {
		for _, v := range vs {
			dst = binary.AppendUvarint(dst, uint64(len(name)))
			dst = append(dst, name...)
			dst = binary.AppendUvarint(dst, uint64(len(v)))
			dst = append(dst, v...)
		}
	})
	dst = binary.AppendUvarint(dst, uint64(len(resp.Body)))
	return append(dst, resp.Body...)
}

// decodeResponse decodes a plain encoding. The body aliases b.
func decodeResponse(b []byte) (*Response, error) {
	if len(b) < 4 || b[0] != encPlain {
		return nil, errCorrupt
	}
	resp := &Response{BodyKept: b[1]&flagKept != 0, Status: int(binary.BigEndian.Uint16(b[2:4]))}
	b = b[4:]
	next := func() ([]byte, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, errCorrupt
		}
		s := b[k : k+int(n)]
		b = b[k+int(n):]
		return s, nil
	}
	count, k := binary.Uvarint(b)
	if k <= 0 || count > uint64(len(b)) {
		return nil, errCorrupt
	}
	b = b[k:]
	if count > 0 {
		resp.Header = make(http.Header, count)
	}
	for i := uint64(0); i < count; i++ {
		name, err := next()
		if err != nil {
			return nil, err
		}
		v, err := next()
		if err != nil {
			return nil, err
		}
		key := string(name)
		resp.Header[key] = append(resp.Header[key], string(v))
	}
	body, err := next()
	if err != nil {
		return nil, err
	}
	if len(b) != 0 {
		return nil, errCorrupt
	}
	if resp.BodyKept {
		resp.Body = body
	}
	return resp, nil
}

// recordedHeader copies the allowlisted headers of h.
func recordedHeader(h http.Header, allow []string) http.Header {
	var out http.Header
	for _, name := range allow {
		vs, ok := h[name]
		if !ok || len(vs) == 0 {
			continue
		}
		if out == nil {
			out = make(http.Header, len(allow))
		}
		out[name] = append([]string(nil), vs...)
	}
	return out
}

// sealResponse encodes resp (only the allowed headers, when allow is not
// nil) and seals it when a sealer is configured.
func (e *Engine) sealResponse(id ID, resp *Response, allow []string) ([]byte, error) {
	plain := encodeResponse(make([]byte, 0, 64+len(resp.Body)), resp, allow)
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
func (e *Engine) openResponse(id ID, b []byte) (*Response, error) {
	if len(b) > 0 && b[0] == encSealed {
		if e.cfg.sealer == nil {
			return nil, errors.New("idem: the recorded response is sealed and no sealer is configured")
		}
		plain, err := e.cfg.sealer.Open(id, b)
		if err != nil {
			return nil, err
		}
		b = plain
	}
	return decodeResponse(b)
}
