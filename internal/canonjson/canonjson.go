// Package canonjson gives a JSON document its canonical form: the bytes
// that two documents share exactly when they denote the same JSON value as
// a decoder reads it (see Append). idem's DefaultFingerprint and
// FingerprintFields hash a JSON body in this form, so that whitespace,
// member order and string escapes do not make a retry a different
// request, while a number's spelling does (Go's decoders read 1, 1.0 and
// 1e0 differently). It is internal: core's fingerprint is its one user
// (docs/contract.md, section 2, states the rules for users).
package canonjson

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"hash"
	"slices"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects Append
// accepts; a deeper document is refused (and idem's DefaultFingerprint hashes its
// raw bytes instead).
const MaxDepth = 128

// ErrInvalid is wrapped by every error of Append: the input is not
// JSON (RFC 8259), or it is JSON that has no single canonical form (invalid
// UTF-8 or a lone surrogate in a string, nesting deeper than MaxDepth, a
// document over 256 MiB).
var ErrInvalid = errors.New("idem: JSON cannot be canonicalised")

// Reasons wrapped, with ErrInvalid, by the errors of Append.
var (
	errJSONSyntax      = errors.New("syntax error")
	errJSONTooDeep     = errors.New("nesting deeper than MaxDepth")
	errJSONInvalidUTF8 = errors.New("invalid UTF-8 in a string")
	errJSONSurrogate   = errors.New("lone surrogate escape in a string")
	errJSONTooLarge    = errors.New("document larger than 256 MiB")
)

type jsonError struct {
	reason error
	off    int
}

func (e *jsonError) Error() string {
	return fmt.Sprintf("%v: %v at byte %d", ErrInvalid, e.reason, e.off)
}

func (e *jsonError) Unwrap() []error { return []error{ErrInvalid, e.reason} }

// Append appends the canonical form of the JSON document src to dst.
// Two documents have the same canonical form when they denote the same JSON
// value as a decoder reads it: same structure, same member names and strings
// (after unescaping), same numbers (as written), and, where a decoder's
// reading depends on the order of an object's members, the same order. The
// form is:
//
//   - no insignificant whitespace;
//   - object members sorted by name, case-insensitively: the unescaped names
//     are compared rune by rune, each rune folded to the smallest rune of its
//     Unicode simple case folding orbit ('a' and 'A' to 'A', 'k' and the
//     Kelvin sign to 'K'), which is how encoding/json matches member names to
//     struct fields. The sort is stable: members whose names are equal after
//     folding (a repeated name included) keep the order they came in,
//     because encoding/json lets the last of them win, so
//     {"qty":1,"Qty":9} (9) and {"Qty":9,"qty":1} (1) differ;
//   - strings unescaped and escaped again in one way: only '"', '\\' and the
//     control characters below U+0020 are escaped (\b \f \n \r \t, otherwise
//     \u00xx with lowercase hex); everything else is raw UTF-8. Invalid UTF-8
//     and lone surrogate escapes are refused;
//   - numbers as they are written: the text is the canonical form, so 1,
//     1.0, 1.00, 1e0, 1E0 and 1e+0 are six different documents, and so are
//     1e3 and 1000, -0 and 0. Go's decoders read them differently (an
//     integer field accepts only an integer literal: 1e3 and 1.0 are
//     errors there; a json.Number or a decimal type keeps the text), so
//     treating them as one value would replay one request's answer to
//     another. The text is checked against the RFC 8259 grammar only: no
//     digit count or exponent is too large;
//   - true, false and null as they are; arrays in order.
//
// The document must be exactly one JSON value, with optional whitespace
// around it (no byte order mark), nested at most MaxDepth deep, and at
// most 256 MiB long. dst may share memory with src. Errors wrap
// ErrInvalid, and dst is returned unchanged with them. The cost is
// linear in len(src) plus sorting the members of each object; besides dst
// and a copy of the form, the working memory is at most 12 bytes per
// object member. idem hashes the form (Hash) and calls Append only in
// its tests.
func Append(dst, src []byte) ([]byte, error) {
	var c canonicaliser
	if err := c.parse(src, nil); err != nil {
		return dst, err
	}
	// The second pass reads src as it writes: into a buffer of its own,
	// so that dst may share src's memory.
	return append(dst, c.emitDocument(nil, nil)...), nil
}

// Hash writes tag and then the canonical form of src to h, and reports
// true; when src has no canonical form it writes nothing and reports
// false. With fields not nil, the top-level value must be an object, and
// only its members whose names match one of fields as encoding/json
// matches names to struct fields (case-insensitively) are kept. The form
// is hashed as it is written through a buffer of hashBuffer bytes, never
// held whole in memory. Hash allocates its working memory (a Hasher);
// [Hasher.Hash] uses the caller's.
func Hash(h hash.Hash, tag []byte, src []byte, fields []string) bool {
	var c Hasher
	return c.Hash(h, tag, src, fields)
}

// Hasher is the working memory of [Hash], for a caller that holds it in a
// larger object of its own (core's per-request state) instead of
// allocating it per document: a document of up to 16 members in up to 4
// objects, nested at most 8 deep (an order with its address, a payment
// with its metadata), needs no other memory. Its zero value is ready; it
// holds no reference to a document once Hash has returned (its buffer
// may still hold the last bytes of the form), so it may be used again.
type Hasher struct{ c canonicaliser }

// Hash is [Hash] in h's working memory.
func (x *Hasher) Hash(h hash.Hash, tag []byte, src []byte, fields []string) bool {
	c := &x.c
	defer func() { c.src, c.sel = nil, nil }()
	if c.parse(src, fields) != nil || (fields != nil && !c.topObject) {
		return false
	}
	h.Write(tag)
	c.emitDocument(c.buf[:0], h)
	return true
}

// hashBuffer is the most of the canonical form Hash holds on its way to
// the hash.
const hashBuffer = 128

// The canonicaliser works in two passes over the source, and never copies
// it. parse validates src and, for each object whose members must be
// written in another order than they came, records that order (the source
// offsets of the members' names). emitDocument then writes the canonical
// form from src, value by value, looking each object up in the records:
// an object without one is written in its own order.
//
// Memory: members holds one int32 per object member (the parse's stack of
// open objects grows from the front, the recorded orders from the back, so
// the two share one array) and objs one record of 16 bytes per reordered
// object (each has two members or more, or is the top-level object
// Hash narrows to its fields), both allocated once for the most there can
// be (in the canonicaliser's own arrays when they are large enough): from
// a count of the colons outside strings, or for documents up to smallJSON
// from the length (a member takes at least 4 bytes) or the colons,
// whichever is fewer; objs for no more objects than the document has
// opening braces. That is at
// most 12 bytes per member, and a member takes at least 5 bytes of source
// (`"":0` and a ',' or '}'), so at most 2.4 bytes per byte of src beyond
// smallJSON (3 below it); the output is hashed as it is written through a
// fixed buffer of hashBuffer bytes. Nesting is bounded by MaxDepth, so
// emitDocument's recursion is too.
type canonicaliser struct {
	src []byte
	i   int // next byte of src

	members []int32 // offsets in src of member names' opening quotes
	top     int     // members[:top]: the members of the open objects
	low     int     // members[low:]: the recorded orders
	objs    []object

	stack     []frame // open arrays and objects (stack[:depth])
	depth     int
	sel       []string // Hash's fields: the top-level members kept
	topObject bool     // the document is an object

	// Output of emitDocument: out, flushed to h when h is set.
	out []byte
	h   hash.Hash
	tmp [24]byte // an escape on its way to out
	one [1]byte  // a byte on its way to a full out

	// The arrays behind members, objs, stack and Hash's out for a small
	// document (see Hasher), so that it needs no memory of its own.
	members0 [16]int32
	objs0    [4]object
	stack0   [8]frame
	buf      [hashBuffer]byte
}

type frame struct {
	start int32 // offset of the '{' or '['; -1 for an array
	m0    int32 // the object's first member in members
}

// object is the recorded order of an object's members.
type object struct {
	start, end int32 // the object in src, braces included
	m0, m1     int32 // members[m0:m1], in the order to write
}

// maxJSONInput is the longest document Append accepts (256 MiB), so
// that offsets fit in int32.
const maxJSONInput = 256 << 20

func (c *canonicaliser) fail(reason error) error {
	return &jsonError{reason: reason, off: c.i}
}

func (c *canonicaliser) skipWS() {
	i, src := c.i, c.src
	for i < len(src) && isSpace[src[i]] {
		i++
	}
	c.i = i
}

// isSpace tells JSON's insignificant whitespace bytes.
var isSpace = [256]bool{' ': true, '\t': true, '\n': true, '\r': true}

// smallJSON is the largest document whose bookkeeping is sized by its
// length rather than by counting its colons (16 KiB: at most 48 KiB of
// bookkeeping).
const smallJSON = 16 << 10

// countColons returns the number of colons outside strings in src: at least
// the number of members of any JSON document that begins with src. A string
// ends at the first quote after it that follows an even number of
// backslashes.
func countColons(src []byte) int {
	n := 0
	for {
		q := bytes.IndexByte(src, '"')
		if q < 0 {
			return n + bytes.Count(src, colon)
		}
		n += bytes.Count(src[:q], colon)
		src = src[q+1:]
		for { // inside a string
			q = bytes.IndexByte(src, '"')
			if q < 0 {
				return n
			}
			backslashes := 0
			for backslashes < q && src[q-1-backslashes] == '\\' {
				backslashes++
			}
			src = src[q+1:]
			if backslashes%2 == 0 {
				break
			}
		}
	}
}

var colon, openBrace = []byte{':'}, []byte{'{'}

// parse runs the first pass over src; sel, when not nil, narrows the
// top-level object to the members it names (Hash's fields).
func (c *canonicaliser) parse(src []byte, sel []string) error {
	c.src, c.i, c.sel = src, 0, sel
	c.depth, c.topObject = 0, false
	c.members, c.objs, c.stack = c.members0[:0], c.objs0[:0], c.stack0[:0]
	if len(src) > maxJSONInput {
		return c.fail(errJSONTooLarge)
	}
	// Members are at most a quarter of the bytes (`"":` and a ',' or '}'
	// each, values aside), and at most the colons (colons in strings only
	// add to the count). For small bodies these bounds cost less than
	// counting the colons outside strings. The objects recorded have two
	// members each or more (or are the top-level one), and each has its
	// opening brace.
	n := len(src)/4 + 1
	if len(src) > smallJSON {
		n = countColons(src)
	} else {
		n = min(n, bytes.Count(src, colon))
	}
	if cap(c.members) < n {
		c.members = make([]int32, n)
	}
	c.members = c.members[:n]
	c.top, c.low = 0, n
	if objs := min(n/2+1, bytes.Count(src, openBrace)); cap(c.objs) < objs {
		c.objs = make([]object, 0, objs)
	}

	for {
		// A value starts here.
		c.skipWS()
		if c.i >= len(src) {
			return c.fail(errJSONSyntax)
		}
		switch b := src[c.i]; b {
		case '{', '[':
			if c.depth >= MaxDepth {
				return c.fail(errJSONTooDeep)
			}
			f := frame{start: -1}
			if b == '{' {
				f = frame{start: int32(c.i), m0: int32(c.top)}
				if c.depth == 0 {
					c.topObject = true
				}
			}
			c.stack = append(c.stack[:c.depth], f)
			c.depth++
			c.i++
			c.skipWS()
			if c.i < len(src) && src[c.i] == b+2 { // '{'+2 == '}', '['+2 == ']'
				c.i++
				if err := c.closeContainer(); err != nil {
					return err
				}
				break
			}
			if b == '{' {
				if err := c.name(); err != nil {
					return err
				}
			}
			continue
		case '"':
			if err := c.str(); err != nil {
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
			if c.depth == 0 {
				if c.i != len(src) {
					return c.fail(errJSONSyntax)
				}
				return nil
			}
			if c.i >= len(src) {
				return c.fail(errJSONSyntax)
			}
			isObj := c.stack[c.depth-1].start >= 0
			b := src[c.i]
			if b == ',' {
				c.i++
				if isObj {
					c.skipWS()
					if err := c.name(); err != nil {
						return err
					}
				}
				break
			}
			if isObj && b == '}' || !isObj && b == ']' {
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

// name reads a member name and the colon after it, and pushes the member.
func (c *canonicaliser) name() error {
	at := c.i
	if c.i >= len(c.src) || c.src[c.i] != '"' {
		return c.fail(errJSONSyntax)
	}
	if err := c.str(); err != nil {
		return err
	}
	c.skipWS()
	if c.i >= len(c.src) || c.src[c.i] != ':' {
		return c.fail(errJSONSyntax)
	}
	c.i++
	if c.top >= c.low { // cannot happen: countColons counted this colon
		return c.fail(errJSONSyntax)
	}
	c.members[c.top] = int32(at)
	c.top++
	return nil
}

// closeContainer closes the innermost array or object; the closing byte has
// been consumed. For an object it decides the order of its members and
// records it unless it is the order they came in.
func (c *canonicaliser) closeContainer() error {
	c.depth--
	f := c.stack[c.depth]
	if f.start < 0 {
		return nil
	}
	ms := c.members[f.m0:c.top]
	c.top = int(f.m0)
	record := false
	if c.depth == 0 && c.sel != nil {
		ms = slices.DeleteFunc(ms, func(m int32) bool { return !c.selected(m) })
		record = true
	}
	if !c.inOrder(ms) {
		// Colliding names keep the order they came in (their offsets).
		slices.SortFunc(ms, func(a, b int32) int { return cmp.Or(c.compareNames(a, b), cmp.Compare(a, b)) })
		record = true
	}
	if record {
		c.low -= len(ms)
		copy(c.members[c.low:], ms)
		c.objs = append(c.objs, object{start: f.start, end: int32(c.i), m0: int32(c.low), m1: int32(c.low + len(ms))})
	}
	return nil
}

// inOrder reports whether the members are in canonical order.
func (c *canonicaliser) inOrder(ms []int32) bool {
	for j := 1; j < len(ms); j++ {
		if c.compareNames(ms[j-1], ms[j]) > 0 {
			return false
		}
	}
	return true
}

// nameRune decodes the rune of the (valid) JSON string in src at i, and
// returns it and the offset after it; at the closing quote it returns -1.
func (c *canonicaliser) nameRune(i int) (rune, int) {
	b := c.src[i]
	switch {
	case b == '"':
		return -1, i
	case b < utf8.RuneSelf && b != '\\':
		return rune(b), i + 1
	case b >= utf8.RuneSelf:
		r, n := utf8.DecodeRune(c.src[i:])
		return r, i + n
	}
	switch c.src[i+1] {
	case 'b':
		return '\b', i + 2
	case 'f':
		return '\f', i + 2
	case 'n':
		return '\n', i + 2
	case 'r':
		return '\r', i + 2
	case 't':
		return '\t', i + 2
	case 'u':
		r := hex4(c.src[i+2:])
		if utf16.IsSurrogate(r) {
			return utf16.DecodeRune(r, hex4(c.src[i+8:])), i + 12
		}
		return r, i + 6
	}
	return rune(c.src[i+1]), i + 2 // '"', '\\', '/'
}

// foldRune folds r as encoding/json does to match member names to struct
// fields: to the smallest rune of its simple case folding orbit.
func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		return rune(upperASCII(byte(r)))
	}
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// compareNames compares the member names at a and b (offsets of their
// opening quotes) by their folded runes; 0 means they collide.
func (c *canonicaliser) compareNames(a, b int32) int {
	i, j := int(a)+1, int(b)+1
	// Bytes that are runes of their own (ASCII, not a quote or an escape)
	// compare folded directly; anything else goes rune by rune below.
	for src := c.src; asciiNameByte[src[i]] && asciiNameByte[src[j]]; i, j = i+1, j+1 {
		if x, y := upperASCII(src[i]), upperASCII(src[j]); x != y {
			return cmp.Compare(x, y)
		}
	}
	for {
		ra, ni := c.nameRune(i)
		rb, nj := c.nameRune(j)
		if ra < 0 || rb < 0 {
			return cmp.Compare(ra, rb) // the shorter name first
		}
		if ra != rb {
			if fa, fb := foldRune(ra), foldRune(rb); fa != fb {
				return cmp.Compare(fa, fb)
			}
		}
		i, j = ni, nj
	}
}

// asciiNameByte tells the bytes of a name that are a rune by themselves:
// ASCII, and neither the closing quote nor an escape's backslash.
var asciiNameByte = func() (t [256]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// upperASCII folds an ASCII byte: a-z to A-Z (foldRune's ASCII case).
func upperASCII(b byte) byte {
	if 'a' <= b && b <= 'z' {
		return b - ('a' - 'A')
	}
	return b
}

// selected reports whether the member name at m matches one of c.sel, as
// compareNames matches names.
func (c *canonicaliser) selected(m int32) bool {
	for _, f := range c.sel {
		i, k := int(m)+1, 0
		for {
			r, ni := c.nameRune(i)
			if r < 0 || k == len(f) {
				if r < 0 && k == len(f) {
					return true
				}
				break
			}
			fr, n := utf8.DecodeRuneInString(f[k:])
			if r != fr && foldRune(r) != foldRune(fr) {
				break
			}
			i, k = ni, k+n
		}
	}
	return false
}

// write appends b to the output; with a hash, the buffer goes to it
// whenever it is full, so it never grows.
func (c *canonicaliser) write(b []byte) {
	if len(c.out)+len(b) <= cap(c.out) {
		c.out = append(c.out, b...)
		return
	}
	c.writeFull(b)
}

func (c *canonicaliser) writeFull(b []byte) {
	if c.h == nil {
		c.out = append(c.out, b...)
		return
	}
	c.h.Write(c.out)
	c.out = c.out[:0]
	if len(b) > cap(c.out) {
		c.h.Write(b)
		return
	}
	c.out = append(c.out, b...)
}

func (c *canonicaliser) writeByte(b byte) {
	if len(c.out) == cap(c.out) {
		c.writeByteFull(b)
		return
	}
	c.out = c.out[:len(c.out)+1]
	c.out[len(c.out)-1] = b
}

func (c *canonicaliser) writeByteFull(b byte) {
	c.one[0] = b
	c.writeFull(c.one[:])
}

// emitDocument runs the second pass over the document parse accepted. With
// h nil it appends the canonical form to dst and returns it; otherwise it
// writes the form to h, using dst (empty, with room) as the buffer.
func (c *canonicaliser) emitDocument(dst []byte, h hash.Hash) []byte {
	slices.SortFunc(c.objs, func(a, b object) int { return cmp.Compare(a.start, b.start) })
	c.out, c.h, c.i = dst, h, 0
	c.value()
	out := c.out
	if h != nil {
		h.Write(out)
	}
	c.out, c.h = nil, nil
	return out
}

// value writes the value at c.i and moves past it.
func (c *canonicaliser) value() {
	c.skipWS()
	switch c.src[c.i] {
	case '{':
		c.object()
	case '[':
		c.array()
	case '"':
		c.emitStr()
	case 't':
		c.emitSpan(c.i + len("true"))
	case 'f':
		c.emitSpan(c.i + len("false"))
	case 'n':
		c.emitSpan(c.i + len("null"))
	default:
		i := c.i
		for i < len(c.src) && numberByte[c.src[i]] {
			i++
		}
		c.emitSpan(i) // a number's text is its canonical form
	}
}

// emitSpan writes src[c.i:end] as it is and moves past it.
func (c *canonicaliser) emitSpan(end int) {
	c.write(c.src[c.i:end])
	c.i = end
}

// numberByte tells the bytes a number is made of; parse has checked the
// number's grammar, and a number is followed by none of them.
var numberByte = [256]bool{'-': true, '+': true, '.': true, 'e': true, 'E': true,
	'0': true, '1': true, '2': true, '3': true, '4': true, '5': true, '6': true, '7': true, '8': true, '9': true}

// emitStr writes the string at c.i, which parse has checked, in canonical
// form and moves past it: the runs between escapes as they
// are, each escape as appendEscapedRune writes its rune.
func (c *canonicaliser) emitStr() {
	src := c.src
	i, from := c.i+1, c.i
	for {
		for src[i] != '"' && src[i] != '\\' {
			i++
		}
		if src[i] == '"' {
			c.i = i + 1
			c.write(src[from:c.i])
			return
		}
		c.write(src[from:i])
		r, next := c.nameRune(i)
		c.write(appendEscapedRune(c.tmp[:0], r))
		i, from = next, next
	}
}

func (c *canonicaliser) object() {
	start := int32(c.i)
	c.writeByte('{')
	if k, ok := slices.BinarySearchFunc(c.objs, start, func(o object, s int32) int { return cmp.Compare(o.start, s) }); ok {
		o := c.objs[k]
		for j, m := range c.members[o.m0:o.m1] {
			if j > 0 {
				c.writeByte(',')
			}
			c.member(m)
		}
		c.writeByte('}')
		c.i = int(o.end)
		return
	}
	// In the order the members came.
	c.i++
	c.skipWS()
	for c.src[c.i] != '}' {
		c.member(int32(c.i))
		c.skipWS()
		if c.src[c.i] == ',' {
			c.writeByte(',')
			c.i++
			c.skipWS()
		}
	}
	c.i++
	c.writeByte('}')
}

// member writes the member whose name starts at m.
func (c *canonicaliser) member(m int32) {
	c.i = int(m)
	c.emitStr()
	c.skipWS()
	c.i++ // ':'
	c.writeByte(':')
	c.value()
}

func (c *canonicaliser) array() {
	c.writeByte('[')
	c.i++
	c.skipWS()
	for c.src[c.i] != ']' {
		c.value()
		c.skipWS()
		if c.src[c.i] == ',' {
			c.writeByte(',')
			c.i++
		}
		c.skipWS()
	}
	c.i++
	c.writeByte(']')
}

func (c *canonicaliser) literal(lit string) error {
	if string(c.src[c.i:min(len(c.src), c.i+len(lit))]) != lit {
		return c.fail(errJSONSyntax)
	}
	c.i += len(lit)
	return nil
}

// str checks the string at c.i (an opening quote) and moves past it:
// emitStr writes it.
func (c *canonicaliser) str() error {
	src := c.src
	i := c.i + 1
	for {
		start, high := i, byte(0)
		for i < len(src) && plainStringByte[src[i]] {
			high |= src[i]
			i++
		}
		// The run ends at an ASCII byte, so no sequence is cut in two.
		if high >= utf8.RuneSelf && !utf8.Valid(src[start:i]) {
			c.i = start
			return c.fail(errJSONInvalidUTF8)
		}
		if i >= len(src) || src[i] < 0x20 {
			c.i = i
			return c.fail(errJSONSyntax)
		}
		if src[i] == '"' {
			c.i = i + 1
			return nil
		}
		// A backslash.
		c.i = i
		if i+1 >= len(src) {
			return c.fail(errJSONSyntax)
		}
		switch src[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			r := hex4(src[i+2:])
			if r < 0 {
				return c.fail(errJSONSyntax)
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if len(src) >= i+12 && src[i+6] == '\\' && src[i+7] == 'u' {
					r2 = hex4(src[i+8:])
				}
				if utf16.DecodeRune(r, r2) == utf8.RuneError {
					return c.fail(errJSONSurrogate)
				}
				i += 6
			}
			i += 4
		default:
			return c.fail(errJSONSyntax)
		}
		i += 2
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

// number checks the number at c.i (strictly by the RFC 8259 grammar) and
// moves past it; value writes it as it is: a number's text is its
// canonical form (see Append).
func (c *canonicaliser) number() error {
	src := c.src
	i := c.i
	if i < len(src) && src[i] == '-' {
		i++
	}
	// Integer part: 0, or a digit 1-9 and more digits.
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
	// Fraction: a point and one digit or more.
	if i < len(src) && src[i] == '.' {
		i++
		if i >= len(src) || !isDigit(src[i]) {
			c.i = i
			return c.fail(errJSONSyntax)
		}
		for i < len(src) && isDigit(src[i]) {
			i++
		}
	}
	// Exponent: e or E, an optional sign, one digit or more.
	if i < len(src) && (src[i] == 'e' || src[i] == 'E') {
		i++
		if i < len(src) && (src[i] == '+' || src[i] == '-') {
			i++
		}
		if i >= len(src) || !isDigit(src[i]) {
			c.i = i
			return c.fail(errJSONSyntax)
		}
		for i < len(src) && isDigit(src[i]) {
			i++
		}
	}
	c.i = i
	return nil
}
