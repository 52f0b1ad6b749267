package core

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// Fingerprinter computes the fingerprint of a request for scope (the
// operation, e.g. "POST /orders/:id"). body is the full request body (already
// read; a Fingerprinter must not read r.Body). Returning (nil, nil) means "no
// fingerprint": a record without a fingerprint cannot be contradicted.
type Fingerprinter func(r *http.Request, scope string, body []byte) ([]byte, error)

// MaxJSONDepth is the deepest nesting of arrays and objects CanonicalJSON
// accepts; a deeper document is refused (and DefaultFingerprint hashes its
// raw bytes instead).
const MaxJSONDepth = 128

// ErrInvalidJSON is wrapped by every error of CanonicalJSON: the input is not
// JSON (RFC 8259), or it is JSON that has no single canonical form (a
// duplicate object key, invalid UTF-8 or a lone surrogate in a string,
// nesting deeper than MaxJSONDepth, a number whose exponent is out of range,
// a document over 256 MiB).
var ErrInvalidJSON = errors.New("idem: JSON cannot be canonicalised")

// Reasons wrapped, with ErrInvalidJSON, by the errors of CanonicalJSON.
var (
	errJSONSyntax        = errors.New("syntax error")
	errJSONDuplicateKey  = errors.New("duplicate object key")
	errJSONTooDeep       = errors.New("nesting deeper than MaxJSONDepth")
	errJSONInvalidUTF8   = errors.New("invalid UTF-8 in a string")
	errJSONSurrogate     = errors.New("lone surrogate escape in a string")
	errJSONExponentRange = errors.New("number exponent out of range")
	errJSONTooLarge      = errors.New("document larger than 256 MiB")
)

type jsonError struct {
	reason error
	off    int
}

func (e *jsonError) Error() string {
	return fmt.Sprintf("%v: %v at byte %d", ErrInvalidJSON, e.reason, e.off)
}

func (e *jsonError) Unwrap() []error { return []error{ErrInvalidJSON, e.reason} }

// maxNumberExponent bounds the exponent of a canonical number in scientific
// form (d.ddd × 10^x, |x| <= maxNumberExponent). Exact arithmetic on larger
// exponents is possible but pointless for request bodies; such numbers are
// refused rather than rounded.
const maxNumberExponent = 1_000_000_000

// CanonicalJSON appends the canonical form of the JSON document src to dst.
// Two documents have the same canonical form exactly when they denote the
// same JSON value: same structure, same member names and strings (after
// unescaping), same numbers (as exact decimal values). The form is:
//
//   - no insignificant whitespace;
//   - object members sorted by name, comparing the unescaped names bytewise
//     as UTF-8; an object with two members of the same name is refused;
//   - strings unescaped and escaped again in one way: only '"', '\\' and the
//     control characters below U+0020 are escaped (\b \f \n \r \t, otherwise
//     \u00xx with lowercase hex); everything else is raw UTF-8. Invalid UTF-8
//     and lone surrogate escapes are refused;
//   - numbers as exact decimal values, never through float64. With the
//     significant digits d (no leading or trailing zeros, k of them) and p the
//     position of the decimal point relative to the first of them (value =
//     0.d × 10^p), the text is the one ECMAScript's Number::toString chooses:
//     an integer when the value is an integer and p <= 21 (100, not 1e2);
//     d with a point inside when 0 < p <= 21 (123.45); 0.000ddd when
//     -6 < p <= 0 (0.001); otherwise d₁.d₂…dₖe±(p-1) (1.5e+21, 1e-7). Zero is
//     always 0 (so -0, 0.0 and 0e5 are 0), a negative value has a leading '-'.
//     A nonzero number whose exponent p-1 is beyond ±1e9 is refused;
//   - true, false and null as they are; arrays in order.
//
// The document must be exactly one JSON value, with optional whitespace
// around it (no byte order mark), nested at most MaxJSONDepth deep, and at
// most 256 MiB long. Errors wrap ErrInvalidJSON, and dst is returned
// unchanged with them. The cost is linear in len(src) plus sorting the
// members of each object.
func CanonicalJSON(dst, src []byte) ([]byte, error) {
	s := getScratch()
	defer s.release()
	if err := s.c.parse(src); err != nil {
		return dst, err
	}
	return s.c.appendCanonical(dst), nil
}

// DefaultFingerprint is the Fingerprinter used when none is configured. It
// returns the SHA-256 (32 bytes) of:
//
//	"idem/fp/v1\n", len(scope) as 8 bytes big endian, scope, '\n',
//	a one-byte kind, the body in the form of that kind
//
// where the kind and form follow the media type of the Content-Type header
// (parsed with mime.ParseMediaType, so case and parameters do not matter):
//
//   - 'e' and nothing for an empty body, whatever its type;
//   - 'j' and CanonicalJSON(body) for application/json and any type with the
//     +json suffix; when the body cannot be canonicalised (invalid JSON,
//     duplicate keys, too deep, ...), 'r' and the raw bytes instead;
//   - 'f' and the canonical form for application/x-www-form-urlencoded:
//     fields sorted by name, the values of one field in the order they came
//     (it can be meaningful), each name and value decoded and escaped again
//     by url.Values.Encode; 'r' and the raw bytes when url.ParseQuery fails;
//   - 'r' and the raw bytes for anything else (multipart, text, no type).
//
// A nil r counts as a request without a Content-Type. It never returns an
// error, and it does not retain body.
func DefaultFingerprint(r *http.Request, scope string, body []byte) ([]byte, error) {
	return fingerprint(make([]byte, 0, sha256.Size), r, scope, body, nil), nil
}

// FingerprintFields returns a Fingerprinter that works like
// DefaultFingerprint on a body narrowed to the named top-level fields: for a
// JSON body, the canonical form of the top-level object with only the named
// members (a missing member differs from a member that is null); for a form
// body, only the named fields. A JSON body whose top level is not an object,
// or that cannot be canonicalised, is hashed as raw bytes, like
// DefaultFingerprint does; so is any other body. With no fields, every JSON
// object (and every form) has the same fingerprint.
func FingerprintFields(fields ...string) Fingerprinter {
	sel := make(map[string]struct{}, len(fields))
	for _, f := range fields {
		sel[f] = struct{}{}
	}
	return func(r *http.Request, scope string, body []byte) ([]byte, error) {
		return fingerprint(make([]byte, 0, sha256.Size), r, scope, body, sel), nil
	}
}

const fingerprintDomain = "idem/fp/v1\n"

// Kind tags of the fingerprint preimage.
const (
	fpEmpty = 'e'
	fpJSON  = 'j'
	fpForm  = 'f'
	fpRaw   = 'r'
)

type mediaKind int

const (
	mediaOther mediaKind = iota
	mediaJSON
	mediaForm
)

func mediaKindOf(r *http.Request) mediaKind {
	if r == nil {
		return mediaOther
	}
	ct := r.Header.Get("Content-Type")
	switch ct {
	case "":
		return mediaOther
	case "application/json", "application/json; charset=utf-8", "application/json;charset=utf-8":
		return mediaJSON // the common spellings, without ParseMediaType's map
	case "application/x-www-form-urlencoded":
		return mediaForm
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
		return mediaOther
	}
	if mt == "application/x-www-form-urlencoded" {
		return mediaForm
	}
	if _, sub, ok := strings.Cut(mt, "/"); ok && (mt == "application/json" || len(sub) > len("+json") && strings.HasSuffix(sub, "+json")) {
		return mediaJSON
	}
	return mediaOther
}

// fingerprint implements DefaultFingerprint (sel == nil) and
// FingerprintFields (sel lists the fields kept).
func fingerprint(dst []byte, r *http.Request, scope string, body []byte, sel map[string]struct{}) []byte {
	s := getScratch()
	defer s.release()
	if s.h == nil {
		s.h = sha256.New()
	}
	h := s.h
	h.Reset()
	hdr := append(s.hdr[:0], fingerprintDomain...)
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(len(scope)))
	hdr = append(hdr, scope...)
	hdr = append(hdr, '\n')
	s.hdr = hdr

	kind, form := byte(fpRaw), body
	media := mediaOther
	if len(body) == 0 {
		kind, form = fpEmpty, nil
	} else {
		media = mediaKindOf(r)
	}
	switch media {
	case mediaJSON:
		if s.c.parse(body) != nil {
			break
		}
		ok := true
		if sel == nil {
			s.out = s.c.appendCanonical(s.out[:0])
		} else {
			s.out, ok = s.c.appendSelected(s.out[:0], sel)
		}
		if ok {
			kind, form = fpJSON, s.out
		}
	case mediaForm:
		vs, err := url.ParseQuery(string(body))
		if err != nil {
			break
		}
		if sel != nil {
			for k := range vs {
				if _, ok := sel[k]; !ok {
					delete(vs, k)
				}
			}
		}
		s.out = append(s.out[:0], vs.Encode()...)
		kind, form = fpForm, s.out
	}
	s.hdr = append(s.hdr, kind)
	h.Write(s.hdr)
	h.Write(form)
	return h.Sum(dst)
}

// scratch is the pooled working memory of CanonicalJSON and the
// fingerprinters. It never holds a reference to a caller's slice once
// released.
type scratch struct {
	c        canonicaliser
	h        hash.Hash
	hdr, out []byte
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// maxPooledBytes bounds the memory a scratch may keep when it goes back to
// the pool, so that one huge body does not pin its memory forever.
const maxPooledBytes = 1 << 20

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

func (s *scratch) release() {
	c := &s.c
	c.src = nil
	size := cap(c.buf) + cap(c.keys) + cap(s.out) + cap(s.hdr) +
		int(unsafe.Sizeof(frame{}))*cap(c.stack) +
		int(unsafe.Sizeof(member{}))*(cap(c.open)+cap(c.done)) +
		int(unsafe.Sizeof(object{}))*cap(c.objs)
	if size <= maxPooledBytes {
		scratchPool.Put(s)
	}
}

// The canonicaliser works in two passes. parse reads src once, left to
// right, and writes every value in canonical form into buf in the order of
// src; for each object it records its members' spans in buf and their
// unescaped names in keys, and sorts those spans when the object closes.
// appendCanonical then copies buf, writing the members of each object that
// was out of order in sorted order. Every byte is copied a bounded number of
// times: the cost is linear plus the sorting.
// Nesting is tracked on an explicit stack; appendCanonical recurses once per
// level of reordered objects, which parse has bounded by MaxJSONDepth.
type canonicaliser struct {
	src []byte
	i   int // next byte of src

	buf  []byte // canonical values, members in their original order
	keys []byte // unescaped member names

	stack []frame  // open arrays and objects
	open  []member // members of the open objects, innermost last
	done  []member // members of closed objects, each object's sorted
	objs  []object // objects in the order they open

	unsorted bool // some object's members are not in order in buf
}

// Offsets are int32 to halve the bookkeeping; maxJSONInput keeps them in
// range (buf grows at most about 5.25 times longer than src: "1e20" becomes
// "100000000000000000000").
type frame struct {
	obj int32 // index in objs, or -1 for an array
	m0  int32 // first member in open
}

type member struct {
	k0, k1     int32 // name in keys
	start, end int32 // `"name":value` in buf
	firstObj   int32 // index in objs of the first object that opens after the member starts
}

type object struct {
	start, end int32 // in buf, braces included
	m0, m1     int32 // members in done, sorted by name
	skip       int32 // index in objs just past the object's descendants
	sorted     bool  // the members are in order in buf already
}

// maxJSONInput is the longest document CanonicalJSON accepts (256 MiB).
const maxJSONInput = 256 << 20

func (c *canonicaliser) fail(reason error) error {
	return &jsonError{reason: reason, off: c.i}
}

func (c *canonicaliser) skipWS() {
	for c.i < len(c.src) {
		switch c.src[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

// parse runs the first pass over src.
func (c *canonicaliser) parse(src []byte) error {
	c.src, c.i = src, 0
	c.buf, c.keys = c.buf[:0], c.keys[:0]
	c.stack, c.open, c.done, c.objs = c.stack[:0], c.open[:0], c.done[:0], c.objs[:0]
	c.unsorted = false
	if len(src) > maxJSONInput {
		return c.fail(errJSONTooLarge)
	}
	for {
		// A value starts here.
		c.skipWS()
		if c.i >= len(src) {
			return c.fail(errJSONSyntax)
		}
		switch src[c.i] {
		case '{', '[':
			if len(c.stack) >= MaxJSONDepth {
				return c.fail(errJSONTooDeep)
			}
			open := src[c.i]
			c.i++
			f := frame{obj: -1}
			if open == '{' {
				f = frame{obj: int32(len(c.objs)), m0: int32(len(c.open))}
				c.objs = append(c.objs, object{start: int32(len(c.buf))})
			}
			c.stack = append(c.stack, f)
			c.buf = append(c.buf, open)
			c.skipWS()
			if c.i < len(src) && src[c.i] == open+2 { // '{'+2 == '}', '['+2 == ']'
				c.i++
				_ = c.closeContainer() // an empty container always closes
				break
			}
			if open == '{' {
				if err := c.key(); err != nil {
					return err
				}
			}
			continue
		case '"':
			if err := c.str(false); err != nil {
				return err
			}
		case 't':
			if err := c.literal("true"); err != nil {
				return err
			}
		case 'f':
			if err := c.literal("false"); err != nil {
				return err
			}
		case 'n':
			if err := c.literal("null"); err != nil {
				return err
			}
		default:
			if err := c.number(); err != nil {
				return err
			}
		}

		// A value ended: close containers until one needs another value.
		for {
			c.skipWS()
			if len(c.stack) == 0 {
				if c.i != len(src) {
					return c.fail(errJSONSyntax)
				}
				return nil
			}
			f := c.stack[len(c.stack)-1]
			if f.obj >= 0 {
				c.open[len(c.open)-1].end = int32(len(c.buf))
			}
			if c.i >= len(src) {
				return c.fail(errJSONSyntax)
			}
			b := src[c.i]
			if b == ',' {
				c.i++
				c.buf = append(c.buf, ',')
				if f.obj >= 0 {
					c.skipWS()
					if err := c.key(); err != nil {
						return err
					}
				}
				break
			}
			if f.obj >= 0 && b == '}' || f.obj < 0 && b == ']' {
				c.i++
				if err := c.closeContainer(); err != nil {
					return err
				}
				continue
			}
			return c.fail(errJSONSyntax)
		}
	}
}

// key reads a member name and the colon after it, and opens the member.
func (c *canonicaliser) key() error {
	if c.i >= len(c.src) || c.src[c.i] != '"' {
		return c.fail(errJSONSyntax)
	}
	m := member{k0: int32(len(c.keys)), start: int32(len(c.buf)), firstObj: int32(len(c.objs))}
	if err := c.str(true); err != nil {
		return err
	}
	m.k1 = int32(len(c.keys))
	c.skipWS()
	if c.i >= len(c.src) || c.src[c.i] != ':' {
		return c.fail(errJSONSyntax)
	}
	c.i++
	c.buf = append(c.buf, ':')
	c.open = append(c.open, m)
	return nil
}

func (c *canonicaliser) memberKey(m member) []byte { return c.keys[m.k0:m.k1] }

// closeContainer closes the innermost array or object; the closing byte has
// been consumed. For an object it sorts the members and refuses duplicates.
func (c *canonicaliser) closeContainer() error {
	f := c.stack[len(c.stack)-1]
	c.stack = c.stack[:len(c.stack)-1]
	if f.obj < 0 {
		c.buf = append(c.buf, ']')
		return nil
	}
	ms := c.open[f.m0:]
	sorted := true
	for j := 1; j < len(ms); j++ {
		cmp := bytes.Compare(c.memberKey(ms[j-1]), c.memberKey(ms[j]))
		if cmp == 0 {
			return c.fail(errJSONDuplicateKey)
		}
		if cmp > 0 {
			sorted = false
			break
		}
	}
	if !sorted {
		if len(ms) <= 12 {
			// Insertion sort: most objects are small, and this avoids
			// the generic sort's indirect comparisons.
			for i := 1; i < len(ms); i++ {
				m := ms[i]
				k := c.keys[m.k0:m.k1]
				j := i
				for ; j > 0 && bytes.Compare(c.keys[ms[j-1].k0:ms[j-1].k1], k) > 0; j-- {
					ms[j] = ms[j-1]
				}
				ms[j] = m
			}
		} else {
			slices.SortFunc(ms, func(a, b member) int {
				return bytes.Compare(c.keys[a.k0:a.k1], c.keys[b.k0:b.k1])
			})
		}
		for j := 1; j < len(ms); j++ {
			if bytes.Equal(c.memberKey(ms[j-1]), c.memberKey(ms[j])) {
				return c.fail(errJSONDuplicateKey)
			}
		}
		c.unsorted = true
	}
	c.buf = append(c.buf, '}')
	o := &c.objs[f.obj]
	o.m0 = int32(len(c.done))
	c.done = append(c.done, ms...)
	o.m1 = int32(len(c.done))
	o.end = int32(len(c.buf))
	o.skip = int32(len(c.objs))
	o.sorted = sorted
	c.open = c.open[:f.m0]
	return nil
}

func (c *canonicaliser) literal(lit string) error {
	if string(c.src[c.i:min(len(c.src), c.i+len(lit))]) != lit {
		return c.fail(errJSONSyntax)
	}
	c.i += len(lit)
	c.buf = append(c.buf, lit...)
	return nil
}

// str reads the string at c.i (an opening quote) and writes it in canonical
// form to buf, and unescaped to keys when key is set.
func (c *canonicaliser) str(key bool) error {
	src := c.src
	i := c.i + 1
	c.buf = append(c.buf, '"')
	for {
		start, high := i, byte(0)
		for i < len(src) && plainStringByte[src[i]] {
			high |= src[i]
			i++
		}
		// The run ends at an ASCII byte, so no sequence is cut in two.
		run := src[start:i]
		if high >= utf8.RuneSelf && !utf8.Valid(run) {
			c.i = start
			return c.fail(errJSONInvalidUTF8)
		}
		c.buf = append(c.buf, run...)
		if key {
			c.keys = append(c.keys, run...)
		}
		if i >= len(src) || src[i] < 0x20 {
			c.i = i
			return c.fail(errJSONSyntax)
		}
		if src[i] == '"' {
			c.i = i + 1
			c.buf = append(c.buf, '"')
			return nil
		}
		// A backslash.
		c.i = i
		if i+1 >= len(src) {
			return c.fail(errJSONSyntax)
		}
		var r rune
		switch src[i+1] {
		case '"', '\\', '/':
			r = rune(src[i+1])
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			r = hex4(src[i+2:])
			if r < 0 {
				return c.fail(errJSONSyntax)
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if len(src) >= i+12 && src[i+6] == '\\' && src[i+7] == 'u' {
					r2 = hex4(src[i+8:])
				}
				r = utf16.DecodeRune(r, r2)
				if r == utf8.RuneError {
					return c.fail(errJSONSurrogate)
				}
				i += 6
			}
			i += 4
		default:
			return c.fail(errJSONSyntax)
		}
		i += 2
		c.buf = appendEscapedRune(c.buf, r)
		if key {
			c.keys = utf8.AppendRune(c.keys, r)
		}
	}
}

// plainStringByte tells the bytes a string holds as they are: not '"', '\\'
// or a control character.
var plainStringByte = func() (t [256]bool) {
	for b := 0x20; b < 256; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// hex4 decodes four hex digits at the start of b, or returns -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, h := range b[:4] {
		switch {
		case '0' <= h && h <= '9':
			h -= '0'
		case 'a' <= h && h <= 'f':
			h -= 'a' - 10
		case 'A' <= h && h <= 'F':
			h -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(h)
	}
	return r
}

func appendEscapedRune(dst []byte, r rune) []byte {
	switch r {
	case '"', '\\':
		return append(dst, '\\', byte(r))
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	if r < 0x20 {
		const hex = "0123456789abcdef"
		return append(dst, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
	}
	return utf8.AppendRune(dst, r)
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// number reads the number at c.i (strictly by the RFC 8259 grammar) and
// writes it in canonical form; see CanonicalJSON.
func (c *canonicaliser) number() error {
	src := c.src
	i := c.i
	neg := false
	if i < len(src) && src[i] == '-' {
		neg = true
		i++
	}
	// Integer part.
	intStart := i
	switch {
	case i < len(src) && src[i] == '0':
		i++
	case i < len(src) && '1' <= src[i] && src[i] <= '9':
		for i < len(src) && isDigit(src[i]) {
			i++
		}
	default:
		c.i = i
		return c.fail(errJSONSyntax)
	}
	intPart := src[intStart:i]
	// Fraction.
	var frac []byte
	if i < len(src) && src[i] == '.' {
		i++
		fracStart := i
		for i < len(src) && isDigit(src[i]) {
			i++
		}
		if i == fracStart {
			c.i = i
			return c.fail(errJSONSyntax)
		}
		frac = src[fracStart:i]
	}
	// Exponent: at most 15 significant digits are kept; more is out of
	// range (unless the value is zero).
	var exp int64
	expBig := false
	if i < len(src) && (src[i] == 'e' || src[i] == 'E') {
		i++
		expNeg := false
		if i < len(src) && (src[i] == '+' || src[i] == '-') {
			expNeg = src[i] == '-'
			i++
		}
		expStart := i
		for i < len(src) && src[i] == '0' {
			i++
		}
		sigStart := i
		for i < len(src) && isDigit(src[i]) {
			if i-sigStart < 15 {
				exp = exp*10 + int64(src[i]-'0')
			} else {
				expBig = true
			}
			i++
		}
		if i == expStart {
			c.i = i
			return c.fail(errJSONSyntax)
		}
		if expNeg {
			exp = -exp
		}
	}
	numEnd := i

	// The digits are s = intPart ++ frac, value = s × 10^(exp-len(frac)).
	n := len(intPart) + len(frac)
	at := func(j int) byte {
		if j < len(intPart) {
			return intPart[j]
		}
		return frac[j-len(intPart)]
	}
	first := 0
	for first < n && at(first) == '0' {
		first++
	}
	if first == n {
		c.i = numEnd
		c.buf = append(c.buf, '0')
		return nil
	}
	last := n - 1
	for at(last) == '0' {
		last--
	}
	if expBig {
		c.i = numEnd
		return c.fail(errJSONExponentRange)
	}
	// d = s[first:last+1], k digits; value = 0.d × 10^p.
	k := int64(last + 1 - first)
	p := exp + int64(len(intPart)) - int64(first)
	if p-1 > maxNumberExponent || p-1 < -maxNumberExponent {
		c.i = numEnd
		return c.fail(errJSONExponentRange)
	}
	c.i = numEnd

	buf := c.buf
	if neg {
		buf = append(buf, '-')
	}
	digits := func(buf []byte, a, b int) []byte { // s[a:b]
		if a < len(intPart) {
			buf = append(buf, intPart[a:min(b, len(intPart))]...)
		}
		if b > len(intPart) {
			buf = append(buf, frac[max(a, len(intPart))-len(intPart):b-len(intPart)]...)
		}
		return buf
	}
	d0, d1 := first, last+1
	switch {
	case k <= p && p <= 21: // integer
		buf = digits(buf, d0, d1)
		for range p - k {
			buf = append(buf, '0')
		}
	case 0 < p && p <= 21: // point inside the digits
		buf = digits(buf, d0, d0+int(p))
		buf = append(buf, '.')
		buf = digits(buf, d0+int(p), d1)
	case -6 < p && p <= 0: // 0.000ddd
		buf = append(buf, '0', '.')
		for range -p {
			buf = append(buf, '0')
		}
		buf = digits(buf, d0, d1)
	default: // d.ddde±x
		buf = digits(buf, d0, d0+1)
		if k > 1 {
			buf = append(buf, '.')
			buf = digits(buf, d0+1, d1)
		}
		buf = append(buf, 'e')
		if p-1 >= 0 {
			buf = append(buf, '+')
		}
		buf = strconv.AppendInt(buf, p-1, 10)
	}
	c.buf = buf
	return nil
}

// appendCanonical runs the second pass: it appends the canonical document to
// dst.
func (c *canonicaliser) appendCanonical(dst []byte) []byte {
	if !c.unsorted {
		return append(dst, c.buf...)
	}
	return c.emit(dst, 0, int32(len(c.buf)), 0)
}

// appendSelected appends the canonical form of the top-level object with
// only the members whose names are in sel. It reports false when the top
// level is not an object.
func (c *canonicaliser) appendSelected(dst []byte, sel map[string]struct{}) ([]byte, bool) {
	if len(c.buf) == 0 || c.buf[0] != '{' {
		return dst, false
	}
	o := c.objs[0]
	dst = append(dst, '{')
	n := 0
	for _, m := range c.done[o.m0:o.m1] {
		if _, ok := sel[string(c.memberKey(m))]; !ok {
			continue
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = c.emit(dst, m.start, m.end, m.firstObj)
	}
	return append(dst, '}'), true
}

// emit appends buf[a:b] with the members of each object that was not in
// order put in order; k is the index in objs of the first object that
// starts at or after a.
func (c *canonicaliser) emit(dst []byte, a, b, k int32) []byte {
	pos := a
	for int(k) < len(c.objs) && c.objs[k].start < b {
		o := &c.objs[k]
		if o.sorted {
			k++ // copied as it is; its descendants come next in objs
			continue
		}
		dst = append(dst, c.buf[pos:o.start]...)
		dst = append(dst, '{')
		for j, m := range c.done[o.m0:o.m1] {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = c.emit(dst, m.start, m.end, m.firstObj)
		}
		dst = append(dst, '}')
		pos, k = o.end, o.skip
	}
	return append(dst, c.buf[pos:b]...)
}
