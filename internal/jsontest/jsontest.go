// Package jsontest holds the JSON test helpers that the canonicaliser's
// tests (internal/canonjson) and the request identity fuzzer (core) share: an
// independent reading of JSON values to compare documents by (encoding/json
// with UseNumber, numbers by their text), and random documents rendered in
// many equivalent spellings.
package jsontest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// probe is what a handler decoding into a struct reads: encoding/json
// matches member names to its fields case-insensitively, and the last of
// colliding members wins. The field names are ones the tests and fuzzers
// use.
type probe struct {
	A, B, K, Amount, Quantity, Item any
	Items                           []struct{ A, B, Sku, Qty any }
	Nested                          *probe
}

// SameStruct decodes a and b into a probe each (numbers as json.Number) and
// compares them with SameJSON, and whether decoding failed; it returns the
// two decoded values as text for a message.
func SameStruct(a, b []byte) (string, string, bool) { return SameDecoded[probe](a, b) }

// SameDecoded is SameStruct for a struct of type T.
func SameDecoded[T any](a, b []byte) (string, string, bool) {
	decode := func(src []byte) (T, error) {
		var p T
		d := json.NewDecoder(bytes.NewReader(src))
		d.UseNumber()
		err := d.Decode(&p)
		return p, err
	}
	pa, errA := decode(a)
	pb, errB := decode(b)
	va, _ := json.Marshal(pa)
	vb, _ := json.Marshal(pb)
	sa, sb := fmt.Sprintf("%s (%v)", va, errA), fmt.Sprintf("%s (%v)", vb, errB)
	if (errA == nil) != (errB == nil) {
		return sa, sb, false
	}
	da, err1 := DecodeUseNumber(va)
	db, err2 := DecodeUseNumber(vb)
	if err1 != nil || err2 != nil {
		return sa, sb, false
	}
	_, ok := SameJSON(da, db, "$")
	return sa, sb, ok
}

func DecodeUseNumber(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data: %v", err)
	}
	return v, nil
}

// SameJSON compares two decoded values, numbers by their text.
func SameJSON(a, b any, path string) (string, bool) {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return path, false
		}
		for k, va := range a {
			vb, ok := b[k]
			if !ok {
				return path + "." + k, false
			}
			if p, ok := SameJSON(va, vb, path+"."+k); !ok {
				return p, false
			}
		}
		return "", true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return path, false
		}
		for i := range a {
			if p, ok := SameJSON(a[i], b[i], fmt.Sprintf("%s[%d]", path, i)); !ok {
				return p, false
			}
		}
		return "", true
	case json.Number:
		// By text: Go's decoders read 1, 1.0 and 1e0 differently (an
		// integer field accepts only the first).
		b, ok := b.(json.Number)
		return path, ok && a == b
	default:
		return path, a == b
	}
}

type (
	Object []Member
	Member struct {
		Key   string
		Value any
	}
	randNumber string // a number's text, rendered as it is
)

func RandomValue(rng *rand.Rand, depth int) any {
	n := 7
	if depth >= 6 {
		n = 4 // scalars only
	}
	switch rng.IntN(n) {
	case 0:
		return [...]string{"true", "false", "null"}[rng.IntN(3)]
	case 1, 2:
		d := make([]byte, 1+rng.IntN(25))
		for i := range d {
			d[i] = byte('0' + rng.IntN(10))
		}
		return randNumber(NumberText(rng.IntN(2) == 0, string(d), rng.IntN(80)-40, rng.Uint32()))
	case 3:
		return String(randomString(rng))
	case 4:
		a := make([]any, rng.IntN(5))
		for i := range a {
			a[i] = RandomValue(rng, depth+1)
		}
		return a
	default:
		var o Object
		for range rng.IntN(7) {
			k := randomString(rng)
			if !slices.ContainsFunc(o, func(m Member) bool { return strings.EqualFold(m.Key, k) }) {
				o = append(o, Member{k, RandomValue(rng, depth+1)})
			}
		}
		return o
	}
}

func randomString(rng *rand.Rand) string {
	pool := []rune{'a', 'b', 'B', 'z', '0', ' ', '"', '\\', '/', '\n', '\t', 0, 0x1f, 0x7f, '<', '&', 'é', 0x2028, 0xfffd, 0xffff, '😀', 0x10ffff}
	r := make([]rune, rng.IntN(6))
	for i := range r {
		r[i] = pool[rng.IntN(len(pool))]
	}
	return string(r)
}

func randomSpace(rng *rand.Rand, b []byte) []byte {
	for range rng.IntN(3) {
		b = append(b, " \t\r\n"[rng.IntN(4)])
	}
	return b
}

// RenderValue writes v with random whitespace, member order and escapes;
// numbers keep their text (one of many spellings, chosen by RandomValue).
func RenderValue(rng *rand.Rand, b []byte, v any) []byte {
	b = randomSpace(rng, b)
	switch v := v.(type) {
	case string:
		b = append(b, v...)
	case randNumber:
		b = append(b, v...)
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = RenderValue(rng, b, e)
		}
		b = randomSpace(rng, b)
		b = append(b, ']')
	case Object:
		b = append(b, '{')
		for i, j := range rng.Perm(len(v)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = randomSpace(rng, b)
			b = renderString(rng, b, v[j].Key)
			b = randomSpace(rng, b)
			b = append(b, ':')
			b = RenderValue(rng, b, v[j].Value)
		}
		b = randomSpace(rng, b)
		b = append(b, '}')
	case String:
		b = renderString(rng, b, string(v))
	}
	return randomSpace(rng, b)
}

// String is a JSON string in a random value (a plain Go string there
// is a literal: true, false or null).
type String string

// renderString writes s as a JSON string, each character in one of the ways
// JSON allows.
func renderString(rng *rand.Rand, b []byte, s string) []byte {
	b = append(b, '"')
	for _, r := range s {
		short := map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}[r]
		switch k := rng.IntN(3); {
		case k == 0 && short != "":
			b = append(b, short...)
		case k <= 1 || r < 0x20 || r == '"' || r == '\\':
			hex := "%04x"
			if rng.IntN(2) == 0 {
				hex = "%04X"
			}
			if r >= 0x10000 {
				r1, r2 := utf16.EncodeRune(r)
				b = fmt.Appendf(b, `\u`+hex+`\u`+hex, r1, r2)
			} else {
				b = fmt.Appendf(b, `\u`+hex, r)
			}
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

// NumberText writes the value (-1)^neg × digits × 10^exp as a JSON number in
// one of many forms chosen by form: leading and trailing zeros added, the
// decimal point moved, the exponent spelt e or E, with or without '+' and
// leading zeros, or left out when it is 0.
func NumberText(neg bool, digits string, exp int, form uint32) string {
	lead := int(form & 7)
	trail := int(form >> 3 & 7)
	s := strings.Repeat("0", lead) + digits + strings.Repeat("0", trail)
	exp -= trail
	q := int(form>>6&0xff) % (len(s) + 1) // digits after the point
	exp += q
	intPart := strings.TrimLeft(s[:len(s)-q], "0")
	if intPart == "" {
		intPart = "0"
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	b.WriteString(intPart)
	if q > 0 {
		b.WriteByte('.')
		b.WriteString(s[len(s)-q:])
	}
	if exp != 0 || form>>14&1 == 1 {
		b.WriteByte("eE"[form>>15&1])
		if exp < 0 {
			b.WriteByte('-')
		} else if form>>16&1 == 1 {
			b.WriteByte('+')
		}
		b.WriteString(strings.Repeat("0", int(form>>17&3)))
		b.WriteString(strconv.Itoa(max(exp, -exp)))
	}
	return b.String()
}
