package core

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

func canonical(s string) (string, error) {
	c, err := CanonicalJSON(nil, []byte(s))
	return string(c), err
}

func TestCanonicalJSON(t *testing.T) {
	long := strings.Repeat("1234567890", 500)
	tests := []struct {
		name, in, want string
	}{
		// Structure and whitespace.
		{"ok, members sorted by key", `{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{"ok, sorted members stay", `{"a":1,"b":2,"c":3}`, `{"a":1,"b":2,"c":3}`},
		{"ok, insignificant whitespace removed", " \t\r\n{ \"a\" : [ 1 , 2 , { } , [ ] ] }\n", `{"a":[1,2,{},[]]}`},
		{"ok, nested objects sorted", `{"b":[{"z":1,"y":{"q":0,"p":[{"n":1,"m":2}]}}],"a":{"d":1,"c":2}}`, `{"a":{"c":2,"d":1},"b":[{"y":{"p":[{"m":2,"n":1}],"q":0},"z":1}]}`},
		{"ok, unsorted inside sorted", `{"a":{"d":1,"c":{"f":1,"e":2}},"b":2}`, `{"a":{"c":{"e":2,"f":1},"d":1},"b":2}`},
		{"ok, sorted inside unsorted", `{"b":{"c":1,"d":2},"a":{"e":[1,{"f":1}]}}`, `{"a":{"e":[1,{"f":1}]},"b":{"c":1,"d":2}}`},
		{"ok, arrays keep order", `[3,1,2,"b","a"]`, `[3,1,2,"b","a"]`},
		{"ok, objects in arrays sorted", `[{"b":1,"a":1},{"d":1,"c":1}]`, `[{"a":1,"b":1},{"c":1,"d":1}]`},
		{"ok, empty containers", `[ { } , [ ] , {"a" : { } } ]`, `[{},[],{"a":{}}]`},
		{"ok, literals", `[true,false,null]`, `[true,false,null]`},
		{"ok, top-level string", ` "x" `, `"x"`},
		{"ok, top-level number", `1.0`, `1`},
		{"ok, keys compared after unescaping", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"ok, quote key sorts before letters", `{"A":1,"\"":2}`, `{"\"":2,"A":1}`},
		{"ok, names compared case-insensitively", `{"a":1,"\\":2,"Z":3}`, `{"a":1,"Z":3,"\\":2}`},
		{"ok, lower case before a later upper case", `{"B":1,"a":2}`, `{"a":2,"B":1}`},
		{"ok, control key sorts first", `{" ":1,"\n":2}`, `{"\n":2," ":1}`},
		{"ok, keys sorted by folded code point", `{"é":1,"z":2,"":4,"\ud83d\ude00":5,"\uffff":6,"ß":7}`, "{\"\":4,\"z\":2,\"é\":1,\"ß\":7,\"\uffff\":6,\"😀\":5}"},

		// Names that collide when case-folded keep their order.
		{"ok, a repeated name keeps the order", `{"b":2,"a":1,"a":2}`, `{"a":1,"a":2,"b":2}`},
		{"ok, a repeated name keeps the order, reversed", `{"a":2,"b":2,"a":1}`, `{"a":2,"a":1,"b":2}`},
		{"ok, colliding names keep their order, others sorted", `{"z":0,"Q":9,"item":"tea","q":1}`, `{"item":"tea","Q":9,"q":1,"z":0}`},
		{"ok, a repeated name after unescaping keeps the order", `{"a":1,"\u0061":2}`, `{"a":1,"a":2}`},
		{"ok, names equal but for case keep the order", `{"item":"tea","quantity":1,"Quantity":9}`, `{"item":"tea","quantity":1,"Quantity":9}`},
		{"ok, names equal but for case keep the order, reversed", `{"item":"tea","Quantity":9,"quantity":1}`, `{"item":"tea","Quantity":9,"quantity":1}`},
		{"ok, Kelvin sign collides with k", `{"k":1,"\u212a":2}`, "{\"k\":1,\"\u212a\":2}"},
		{"ok, long s collides with S", `{"ſ":1,"S":2}`, `{"ſ":1,"S":2}`},
		{"ok, colliding object inside a sorted parent", `{"b":{"x":1,"X":2},"a":{"d":1,"c":2}}`, `{"a":{"c":2,"d":1},"b":{"x":1,"X":2}}`},
		{"ok, sorted object inside a colliding parent", `{"b":{"d":1,"c":2},"B":0}`, `{"b":{"c":2,"d":1},"B":0}`},
		{"ok, duplicate empty names keep the order", `{"":1,"":2}`, `{"":1,"":2}`},
		{"ok, prefix key sorts first", `{"ab":1,"a":2}`, `{"a":2,"ab":1}`},
		{"ok, keys sorted lexically, not by length", `{"b":1,"aa":2}`, `{"aa":2,"b":1}`},
		{"ok, many members", `{"j":0,"i":1,"h":2,"g":3,"f":4,"e":5,"d":6,"c":7,"b":8,"a":9}`, `{"a":9,"b":8,"c":7,"d":6,"e":5,"f":4,"g":3,"h":2,"i":1,"j":0}`},

		// Strings.
		{"ok, unicode escape becomes raw UTF-8", `"\u00e9"`, `"é"`},
		{"ok, raw UTF-8 stays", `"é日本😀"`, `"é日本😀"`},
		{"ok, escaped solidus becomes raw", `["\/","\u002F","\u002f"]`, `["/","/","/"]`},
		{"ok, short escapes kept", `"\b\f\n\r\t\"\\"`, `"\b\f\n\r\t\"\\"`},
		{"ok, unicode escapes of short forms", `"\u0008\u000C\u000a\u000D\u0009\u0022\u005C"`, `"\b\f\n\r\t\"\\"`},
		{"ok, other controls as lowercase u escapes", `"\u0000\u001F\u0001\u000B"`, `"\u0000\u001f\u0001\u000b"`},
		{"ok, DEL and U+2028 raw", `"\u007f\u2028\u2029"`, "\"\x7f\u2028\u2029\""},
		{"ok, HTML characters raw", `"\u003c\u003e\u0026<>&"`, `"<>&<>&"`},
		{"ok, surrogate pair", `"\ud83d\ude00\uD83D\uDE00"`, `"😀😀"`},
		{"ok, replacement character escape", `"\ufffd"`, "\"\ufffd\""},
		{"ok, noncharacters kept", `"\uffff\ufffe"`, "\"\uffff\ufffe\""},

		// Numbers.
		{"ok, 1", `1`, `1`},
		{"ok, 1.0 and 1 agree", `1.0`, `1`},
		{"ok, 1.00 and 1 agree", `1.00`, `1`},
		{"ok, 1e0 and 1 agree", `1e0`, `1`},
		{"ok, 10e-1 and 1 agree", `10e-1`, `1`},
		{"ok, 0.1e1 and 1 agree", `0.1e1`, `1`},
		{"ok, 1E+0 and 1 agree", `1E+0`, `1`},
		{"ok, exponent with leading zeros", `1e00000000000000000000000000`, `1`},
		{"ok, -0 is 0", `-0`, `0`},
		{"ok, 0.0 is 0", `0.0`, `0`},
		{"ok, 0e5 is 0", `0e5`, `0`},
		{"ok, -0.000e-7 is 0", `-0.000e-7`, `0`},
		{"ok, zero with huge exponent is 0", `0e99999999999999999999999`, `0`},
		{"ok, 100", `100`, `100`},
		{"ok, 1E+2 and 100 agree", `1E+2`, `100`},
		{"ok, 1e+02 and 100 agree", `1e+02`, `100`},
		{"ok, 0.01e4 and 100 agree", `0.01e4`, `100`},
		{"ok, 100.000 and 100 agree", `100.000`, `100`},
		{"ok, negative", `-1.50`, `-1.5`},
		{"ok, fraction", `123.4500`, `123.45`},
		{"ok, 0.5", `0.5`, `0.5`},
		{"ok, 5e-1 and 0.5 agree", `5e-1`, `0.5`},
		{"ok, small fixed", `-0.000123`, `-0.000123`},
		{"ok, 1e-6 fixed", `1e-6`, `0.000001`},
		{"ok, 1e-7 scientific", `0.0000001`, `1e-7`},
		{"ok, 1.5e-7", `15e-8`, `1.5e-7`},
		{"ok, 20 digits integer", `12345678901234567890`, `12345678901234567890`},
		{"ok, 12345678901234567890.5 kept exactly", `12345678901234567890.5`, `12345678901234567890.5`},
		{"ok, 12345678901234567891", `12345678901234567891`, `12345678901234567891`},
		{"ok, 1e20 integer", `1e20`, `100000000000000000000`},
		{"ok, 21 digits integer", `123456789012345678901`, `123456789012345678901`},
		{"ok, 1e21 scientific", `1e21`, `1e+21`},
		{"ok, 22 digits scientific", `1234567890123456789012`, `1.234567890123456789012e+21`},
		{"ok, 22 digits with fraction", `1234567890123456789012.5`, `1.2345678901234567890125e+21`},
		{"ok, 21 digits with fraction", `123456789012345678901.5`, `123456789012345678901.5`},
		{"ok, 1e400 exact", `1e400`, `1e+400`},
		{"ok, 1e-400 exact", `1e-400`, `1e-400`},
		{"ok, 10e399 is 1e400", `10e399`, `1e+400`},
		{"ok, largest exponent", `1e1000000000`, `1e+1000000000`},
		{"ok, largest exponent via digits", `10e999999999`, `1e+1000000000`},
		{"ok, smallest exponent", `-1.5e-1000000000`, `-1.5e-1000000000`},
		{"ok, smallest exponent via fraction", `0.1e-999999999`, `1e-1000000000`},
		{"ok, long integer", long, long[:1] + "." + strings.TrimRight(long[1:], "0") + "e+4999"},
		{"ok, long fraction", "0." + long, "0." + strings.TrimRight(long, "0")},
		{"ok, long trailing zeros", "1" + strings.Repeat("0", 5000) + "e-5000", "1"},
		{"ok, long leading zeros", "0." + strings.Repeat("0", 5000) + "1e5001", "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := canonical(tt.in)
			if err != nil {
				t.Fatalf("CanonicalJSON(%.80q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("CanonicalJSON(%.80q)\n got %.200q\nwant %.200q", tt.in, got, tt.want)
			}
			checkCanonical(t, []byte(tt.in), []byte(got))
		})
	}
}

func TestCanonicalJSONAppends(t *testing.T) {
	dst := []byte("prefix:")
	got, err := CanonicalJSON(dst, []byte(`{"b":1,"a":2}`))
	if err != nil || string(got) != `prefix:{"a":2,"b":1}` {
		t.Fatalf("got %q, %v", got, err)
	}
	got, err = CanonicalJSON(dst, []byte(`{"b":1,`))
	if err == nil || string(got) != "prefix:" {
		t.Fatalf("on error: got %q, %v; want dst unchanged and an error", got, err)
	}
	// The output may overwrite the input.
	src := []byte(`{ "b" : 1 , "a" : 2 }`)
	got, err = CanonicalJSON(src[:0], src)
	if err != nil || string(got) != `{"a":2,"b":1}` {
		t.Fatalf("in place: got %q, %v", got, err)
	}
}

func TestCanonicalJSONErrors(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	deepObj := func(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }
	tests := []struct {
		name, in string
		reason   error
	}{
		{"nok, empty", ``, errJSONSyntax},
		{"nok, only whitespace", " \n", errJSONSyntax},
		{"nok, trailing comma in array", `[1,]`, errJSONSyntax},
		{"nok, trailing comma in object", `{"a":1,}`, errJSONSyntax},
		{"nok, leading comma", `[,1]`, errJSONSyntax},
		{"nok, leading zero", `01`, errJSONSyntax},
		{"nok, negative leading zero", `-01`, errJSONSyntax},
		{"nok, leading zero in array", `[00]`, errJSONSyntax},
		{"nok, fraction without integer", `.5`, errJSONSyntax},
		{"nok, point without fraction", `1.`, errJSONSyntax},
		{"nok, point then exponent", `1.e5`, errJSONSyntax},
		{"nok, plus sign", `+1`, errJSONSyntax},
		{"nok, lone minus", `-`, errJSONSyntax},
		{"nok, minus space", `- 1`, errJSONSyntax},
		{"nok, exponent without digits", `1e`, errJSONSyntax},
		{"nok, exponent sign without digits", `1e+`, errJSONSyntax},
		{"nok, hex", `0x10`, errJSONSyntax},
		{"nok, two points", `1.2.3`, errJSONSyntax},
		{"nok, NaN", `NaN`, errJSONSyntax},
		{"nok, Infinity", `-Infinity`, errJSONSyntax},
		{"nok, unterminated string", `"abc`, errJSONSyntax},
		{"nok, unterminated escape", `"abc\`, errJSONSyntax},
		{"nok, unknown escape", `"\x41"`, errJSONSyntax},
		{"nok, short unicode escape", `"\u12"`, errJSONSyntax},
		{"nok, bad hex in unicode escape", `"\u12G4"`, errJSONSyntax},
		{"nok, raw tab in string", "\"a\tb\"", errJSONSyntax},
		{"nok, raw NUL in string", "\"a\x00b\"", errJSONSyntax},
		{"nok, single quotes", `'a'`, errJSONSyntax},
		{"nok, unquoted key", `{a:1}`, errJSONSyntax},
		{"nok, number key", `{1:1}`, errJSONSyntax},
		{"nok, missing colon", `{"a" 1}`, errJSONSyntax},
		{"nok, missing value", `{"a":}`, errJSONSyntax},
		{"nok, missing comma in object", `{"a":1 "b":2}`, errJSONSyntax},
		{"nok, missing comma in array", `[1 2]`, errJSONSyntax},
		{"nok, truncated true", `tru`, errJSONSyntax},
		{"nok, truncated null", `[nul]`, errJSONSyntax},
		{"nok, capitalised literal", `True`, errJSONSyntax},
		{"nok, literal with suffix", `truex`, errJSONSyntax},
		{"nok, unterminated array", `[1`, errJSONSyntax},
		{"nok, unterminated object", `{"a":1`, errJSONSyntax},
		{"nok, unterminated key", `{"a`, errJSONSyntax},
		{"nok, mismatched brackets", `[1}`, errJSONSyntax},
		{"nok, mismatched braces", `{"a":1]`, errJSONSyntax},
		{"nok, extra close", `[1]]`, errJSONSyntax},
		{"nok, lone close", `]`, errJSONSyntax},
		{"nok, trailing garbage", `{}x`, errJSONSyntax},
		{"nok, two documents", `1 2`, errJSONSyntax},
		{"nok, trailing NUL", "1\x00", errJSONSyntax},
		{"nok, leading BOM", "\xef\xbb\xbf{}", errJSONSyntax},
		{"nok, non-JSON whitespace", "\v1", errJSONSyntax},
		{"nok, comment", `[1/*x*/]`, errJSONSyntax},

		{"nok, invalid UTF-8", "\"\xff\"", errJSONInvalidUTF8},
		{"nok, truncated UTF-8", "\"\xc3\"", errJSONInvalidUTF8},
		{"nok, overlong UTF-8", "\"\xc0\xaf\"", errJSONInvalidUTF8},
		{"nok, UTF-8 encoded surrogate", "\"\xed\xa0\x80\"", errJSONInvalidUTF8},
		{"nok, invalid UTF-8 in key", "{\"\xff\":1}", errJSONInvalidUTF8},
		{"nok, lone high surrogate", `"\ud800"`, errJSONSurrogate},
		{"nok, lone low surrogate", `"\udc00"`, errJSONSurrogate},
		{"nok, high surrogate then letter", `"\ud800x"`, errJSONSurrogate},
		{"nok, high surrogate then BMP escape", `"\ud800\u0041"`, errJSONSurrogate},
		{"nok, surrogates reversed", `"\udc00\ud800"`, errJSONSurrogate},
		{"nok, two high surrogates", `"\ud800\ud800"`, errJSONSurrogate},

		{"nok, depth 129 arrays", deep(MaxJSONDepth + 1), errJSONTooDeep},
		{"nok, depth 129 objects", deepObj(MaxJSONDepth + 1), errJSONTooDeep},
		{"nok, depth 100000", deep(100000), errJSONTooDeep},

		{"nok, exponent beyond range", `1e1000000001`, errJSONExponentRange},
		{"nok, exponent beyond range via digits", `100e999999999`, errJSONExponentRange},
		{"nok, negative exponent beyond range", `1e-1000000001`, errJSONExponentRange},
		{"nok, negative exponent beyond range via fraction", `0.01e-999999999`, errJSONExponentRange},
		{"nok, huge exponent", `1e999999999999`, errJSONExponentRange},
		{"nok, exponent overflowing int64", `1e99999999999999999999999999`, errJSONExponentRange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := canonical(tt.in)
			if err == nil {
				t.Fatalf("CanonicalJSON(%.80q) = %.80q, want an error", tt.in, got)
			}
			if !errors.Is(err, ErrInvalidJSON) || !errors.Is(err, tt.reason) {
				t.Fatalf("CanonicalJSON(%.80q): %v, want ErrInvalidJSON and %v", tt.in, err, tt.reason)
			}
			checkAgainstEncodingJSON(t, []byte(tt.in), nil, err)
		})
	}
}

func TestCanonicalJSONDepth(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"ok, depth 128 arrays", strings.Repeat("[", 128) + strings.Repeat("]", 128), true},
		{"ok, depth 128 mixed", strings.Repeat(`[{"a":`, 64) + "1" + strings.Repeat("}]", 64), true},
		{"nok, depth 129 mixed", strings.Repeat(`[{"a":`, 64) + "[]" + strings.Repeat("}]", 64), false},
		{"ok, depth 128 unsorted objects", strings.Repeat(`{"b":0,"a":`, 128) + "1" + strings.Repeat("}", 128), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := canonical(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok = %v", err, tt.ok)
			}
			if err == nil {
				checkCanonical(t, []byte(tt.in), []byte(got))
			}
		})
	}
	got, _ := canonical(strings.Repeat(`{"b":0,"a":`, 3) + "1" + strings.Repeat("}", 3))
	if want := `{"a":{"a":{"a":1,"b":0},"b":0},"b":0}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestCanonicalJSONEquivalence: documents that denote the same value have
// the same canonical form, and documents that do not have different ones.
func TestCanonicalJSONEquivalence(t *testing.T) {
	same := []struct{ name, a, b string }{
		{"ok, key order", `{"a":1,"b":[1,2],"c":{"x":null,"y":true}}`, `{"c":{"y":true,"x":null},"b":[1,2],"a":1}`},
		{"ok, whitespace", `{"a":[1,2]}`, "{\n  \"a\": [\n    1,\n    2\n  ]\n}\n"},
		{"ok, escapes and raw", `{"\u00e9\/":"\u003ctag\u003e"}`, `{"é/":"<tag>"}`},
		{"ok, 1.0 and 1", `{"n":1.0}`, `{"n":1}`},
		{"ok, 1.00 and 1e0", `[1.00]`, `[1e0]`},
		{"ok, 10e-1 and 0.1e1", `10e-1`, `0.1e1`},
		{"ok, -0 and 0", `-0`, `0`},
		{"ok, 1E+2 and 100", `1E+2`, `100`},
		{"ok, 1e400 and 1e400", `1e400`, `1e400`},
		{"ok, 1e400 and 10e399", `1e400`, `10e399`},
		{"ok, 1e-400 and 0.1e-399", `1e-400`, `0.1e-399`},
		{"ok, 12345678901234567890.5 and 1234567890123456789050e-2", `12345678901234567890.5`, `1234567890123456789050e-2`},
	}
	for _, tt := range same {
		t.Run(tt.name, func(t *testing.T) {
			a, errA := canonical(tt.a)
			b, errB := canonical(tt.b)
			if errA != nil || errB != nil {
				t.Fatalf("errors: %v, %v", errA, errB)
			}
			if a != b {
				t.Fatalf("%s -> %s\n%s -> %s\nwant the same", tt.a, a, tt.b, b)
			}
		})
	}
	differ := []struct{ name, a, b string }{
		{"nok, 12345678901234567890.5 and 12345678901234567890", `12345678901234567890.5`, `12345678901234567890`},
		{"nok, 12345678901234567890.5 and 12345678901234567891", `12345678901234567890.5`, `12345678901234567891`},
		{"nok, 9007199254740993 and 9007199254740992", `9007199254740993`, `9007199254740992`},
		{"nok, 0.1 and 0.10000000000000001", `0.1`, `0.10000000000000001`},
		{"nok, 1e400 and 1e401", `1e400`, `1e401`},
		{"nok, 1e-400 and 0", `1e-400`, `0`},
		{"nok, 1 and -1", `1`, `-1`},
		{"nok, 1 and \"1\"", `1`, `"1"`},
		{"nok, null and missing", `{"a":null}`, `{}`},
		{"nok, array order", `[1,2]`, `[2,1]`},
		{"nok, key case", `{"a":1}`, `{"A":1}`},
		{"nok, nested vs flat", `{"a":{"b":1}}`, `{"a":"{\"b\":1}"}`},
		{"nok, 1e21 and 1e20", `1e21`, `1e20`},
	}
	for _, tt := range differ {
		t.Run(tt.name, func(t *testing.T) {
			a, errA := canonical(tt.a)
			b, errB := canonical(tt.b)
			if errA != nil || errB != nil {
				t.Fatalf("errors: %v, %v", errA, errB)
			}
			if a == b {
				t.Fatalf("%s and %s both -> %s, want different forms", tt.a, tt.b, a)
			}
		})
	}
}

// TestCanonicalJSONAgainstEncodingJSON runs the checks the fuzz target runs
// on a set of larger documents.
func TestCanonicalJSONAgainstEncodingJSON(t *testing.T) {
	for _, in := range []string{
		benchBody,
		`{"emoji":"\ud83d\ude00","html":"<a href=\"x\">&amp;</a>","ctl":"\u0001\u001f","ls":"\u2028"}`,
		`[{"id":1,"tags":["a","b"],"price":{"amount":"12.50","value":12.50e0}},{"id":2,"tags":[],"price":null}]`,
		`{"z":{"y":{"x":{"w":[{"v":1,"u":2},{"t":[3,4,{"s":5,"r":6}]}]}}},"a":[[[[]]]]}`,
		`[-0.0, 0e0, 1E-0, 123456789012345678901234567890, 1.5e300, -2.5e-300, 1e-7, 1e21]`,
	} {
		c, err := CanonicalJSON(nil, []byte(in))
		if err != nil {
			t.Fatalf("CanonicalJSON(%q): %v", in, err)
		}
		checkCanonical(t, []byte(in), c)
	}
}

// checkCanonical checks the properties of c, the canonical form of src:
// CanonicalJSON(c) == c; c is valid JSON; c decodes to the same structure as
// src, numbers compared as exact decimals; and encoding/json's own
// re-serialisation of src (indented, keys re-ordered, <>& escaped) has the
// same canonical form.
func checkCanonical(t *testing.T, src, c []byte) {
	t.Helper()
	if !json.Valid(c) {
		t.Fatalf("canonical form %.200q of %.200q is not valid JSON", c, src)
	}
	c2, err := CanonicalJSON(nil, c)
	if err != nil || !bytes.Equal(c, c2) {
		t.Fatalf("not idempotent: %.200q -> %.200q, %v", c, c2, err)
	}
	v1, err := decodeUseNumber(src)
	if err != nil {
		t.Fatalf("encoding/json cannot decode %.200q: %v", src, err)
	}
	v2, err := decodeUseNumber(c)
	if err != nil {
		t.Fatalf("encoding/json cannot decode %.200q: %v", c, err)
	}
	if path, ok := sameJSON(v1, v2, "$"); !ok {
		t.Fatalf("canonical form %.200q of %.200q differs at %s", c, src, path)
	}
	if s1, s2, ok := sameStruct(src, c); !ok {
		t.Fatalf("canonical form %.200q of %.200q decodes into a struct differently:\n%s\n%s", c, src, s1, s2)
	}
	if hasCollision(src) {
		// encoding/json keeps one of the colliding members only, and
		// reorders them: its re-serialisation is another request.
		return
	}
	var re bytes.Buffer
	enc := json.NewEncoder(&re)
	enc.SetIndent(" ", "\t")
	if err := enc.Encode(v1); err != nil {
		t.Fatalf("encoding/json cannot encode %.200q: %v", src, err)
	}
	c3, err := CanonicalJSON(nil, re.Bytes())
	if err != nil || !bytes.Equal(c, c3) {
		t.Fatalf("re-serialised %.200q\n-> %.200q, %v\nwant %.200q", re.Bytes(), c3, err, c)
	}
}

// probe is what a handler decoding into a struct reads: encoding/json
// matches member names to its fields case-insensitively, and the last of
// colliding members wins. The field names are ones the tests and fuzzers
// use.
type probe struct {
	A, B, K, Amount, Quantity, Item any
	Items                           []struct{ A, B, Sku, Qty any }
	Nested                          *probe
}

// sameStruct decodes a and b into a probe each (numbers as json.Number) and
// compares them with sameJSON, and whether decoding failed; it returns the
// two decoded values as text for a message.
func sameStruct(a, b []byte) (string, string, bool) { return sameDecoded[probe](a, b) }

// sameDecoded is sameStruct for a struct of type T.
func sameDecoded[T any](a, b []byte) (string, string, bool) {
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
	da, err1 := decodeUseNumber(va)
	db, err2 := decodeUseNumber(vb)
	if err1 != nil || err2 != nil {
		return sa, sb, false
	}
	_, ok := sameJSON(da, db, "$")
	return sa, sb, ok
}

func decodeUseNumber(b []byte) (any, error) {
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

// sameJSON compares two decoded values, numbers by exact decimal value.
func sameJSON(a, b any, path string) (string, bool) {
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
			if p, ok := sameJSON(va, vb, path+"."+k); !ok {
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
			if p, ok := sameJSON(a[i], b[i], fmt.Sprintf("%s[%d]", path, i)); !ok {
				return p, false
			}
		}
		return "", true
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return path, false
		}
		da, okA := parseDecimal(string(a))
		db, okB := parseDecimal(string(b))
		return path, okA && okB && da == db
	default:
		return path, a == b
	}
}

// decimal is an exact decimal value: (-1)^neg × 0.digits × 10^point, with
// digits free of leading and trailing zeros; zero is the zero value.
type decimal struct {
	neg    bool
	digits string
	point  int64
}

// parseDecimal is a deliberately simple, independent reading of a JSON
// number into an exact decimal (strings and strconv only).
func parseDecimal(s string) (decimal, bool) {
	var d decimal
	if strings.HasPrefix(s, "-") {
		d.neg, s = true, s[1:]
	}
	mant, expText := s, "0"
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, expText = s[:i], strings.TrimPrefix(s[i+1:], "+")
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	trimmed := strings.TrimLeft(digits, "0")
	d.digits = strings.TrimRight(trimmed, "0")
	if d.digits == "" {
		return decimal{}, true // zero, whatever the exponent
	}
	exp, err := strconv.ParseInt(expText, 10, 64)
	if err != nil {
		return d, false
	}
	d.point = int64(len(intPart)) + exp - int64(len(digits)-len(trimmed))
	return d, true
}

// checkAgainstEncodingJSON checks that CanonicalJSON accepts src exactly when
// encoding/json does, except for what it refuses on purpose: nesting beyond MaxJSONDepth, invalid UTF-8 and lone surrogates in strings
// (which encoding/json replaces with U+FFFD), exponents out of range. Each
// such refusal is confirmed independently.
func checkAgainstEncodingJSON(t *testing.T, src, c []byte, err error) {
	t.Helper()
	valid := json.Valid(src)
	switch {
	case err == nil && !valid:
		t.Fatalf("CanonicalJSON accepts %.200q (-> %.200q), encoding/json does not", src, c)
	case err != nil && valid:
		var why string
		switch {
		case errors.Is(err, errJSONTooDeep):
			if depthOf(src) <= MaxJSONDepth {
				why = "nesting is not too deep"
			}
		case errors.Is(err, errJSONInvalidUTF8):
			if utf8.Valid(src) {
				why = "the input is valid UTF-8"
			}
		case errors.Is(err, errJSONSurrogate):
			if !surrogateEscape.Match(src) {
				why = "no surrogate escape in the input"
			}
		case errors.Is(err, errJSONExponentRange):
			if !bigExponent.Match(src) {
				why = "no large exponent in the input"
			}
		default:
			why = "not one of the deliberate refusals"
		}
		if why != "" {
			t.Fatalf("CanonicalJSON refuses %.200q (%v) that encoding/json accepts: %s", src, err, why)
		}
	}
}

var (
	surrogateEscape = regexp.MustCompile(`\\u[dD][89a-fA-F]`)
	bigExponent     = regexp.MustCompile(`[eE][-+]?0*[1-9][0-9]{8}`)
)

// hasCollision walks src with encoding/json's tokenizer and reports
// whether an object has two members whose (decoded) names are equal under
// strings.EqualFold, a repeated name included.
func hasCollision(src []byte) bool {
	d := json.NewDecoder(bytes.NewReader(src))
	d.UseNumber() // 1e400 is not an error
	type obj struct {
		names  []string
		expKey bool
	}
	var stack []*obj
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *obj
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.expKey {
			if k, ok := tok.(string); ok {
				for _, n := range top.names {
					if strings.EqualFold(n, k) {
						return true
					}
				}
				top.names = append(top.names, k)
				top.expKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &obj{names: []string{}, expKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &obj{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the enclosing object expects a key next.
		if len(stack) > 0 && stack[len(stack)-1].names != nil {
			stack[len(stack)-1].expKey = true
		}
	}
}

// depthOf returns the deepest nesting in src, by encoding/json's tokenizer.
func depthOf(src []byte) int {
	d := json.NewDecoder(bytes.NewReader(src))
	d.UseNumber()
	depth, most := 0, 0
	for {
		tok, err := d.Token()
		if err != nil {
			return most
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			most = max(most, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

func TestCanonicalJSONEdgeInputsAgainstEncodingJSON(t *testing.T) {
	for _, in := range []string{
		``, `[`, `]`, `{}`, `[]`, `""`, `"`, `1`, `-`, `0`, `00`, `-0`, `1e5`, `1E-5`, `1.5e+5`, `"\u0000"`,
		"\"\xff\"", `"\ud800"`, `{"a":1,"a":1}`, `{"a":[{"b":1,"b":2}]}`, "\xef\xbb\xbf1", " 1 ", "1 x",
		`{"a":1}{"b":2}`, `[1,2,]`, `[true false]`, `nulll`, `{"":""}`, `[-]`, `[1e1.5]`, `1e999999999999`,
		strings.Repeat("[", 129) + strings.Repeat("]", 129),
	} {
		c, err := CanonicalJSON(nil, []byte(in))
		checkAgainstEncodingJSON(t, []byte(in), c, err)
		if err == nil {
			checkCanonical(t, []byte(in), c)
		}
	}
}

// TestCanonicalJSONRandomDocuments writes random JSON values twice, each
// time with its own member order, whitespace, string escapes and number
// spelling, and checks that both texts have the same canonical form.
func TestCanonicalJSONRandomDocuments(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		v := randomValue(rng, 0)
		a := renderValue(rng, nil, v)
		b := renderValue(rng, nil, v)
		ca, err := CanonicalJSON(nil, a)
		if err != nil {
			t.Fatalf("document %d: CanonicalJSON(%.300q): %v", i, a, err)
		}
		cb, err := CanonicalJSON(nil, b)
		if err != nil {
			t.Fatalf("document %d: CanonicalJSON(%.300q): %v", i, b, err)
		}
		if !bytes.Equal(ca, cb) {
			t.Fatalf("document %d: one value, two forms:\n%.300q\n-> %.300q\n%.300q\n-> %.300q", i, a, ca, b, cb)
		}
		checkCanonical(t, a, ca)
	}
}

type (
	randObject []randMember
	randMember struct {
		key string
		val any
	}
	randNumber struct {
		neg    bool
		digits string
		exp    int
	}
)

func randomValue(rng *rand.Rand, depth int) any {
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
		return randNumber{neg: rng.IntN(2) == 0, digits: string(d), exp: rng.IntN(80) - 40}
	case 3:
		return stringValue(randomString(rng))
	case 4:
		a := make([]any, rng.IntN(5))
		for i := range a {
			a[i] = randomValue(rng, depth+1)
		}
		return a
	default:
		var o randObject
		for range rng.IntN(7) {
			k := randomString(rng)
			if !slices.ContainsFunc(o, func(m randMember) bool { return strings.EqualFold(m.key, k) }) {
				o = append(o, randMember{k, randomValue(rng, depth+1)})
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

// renderValue writes v with random whitespace, member order, escapes and
// number spelling.
func renderValue(rng *rand.Rand, b []byte, v any) []byte {
	b = randomSpace(rng, b)
	switch v := v.(type) {
	case string:
		b = append(b, v...)
	case randNumber:
		b = append(b, numberText(v.neg, v.digits, v.exp, rng.Uint32())...)
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = renderValue(rng, b, e)
		}
		b = randomSpace(rng, b)
		b = append(b, ']')
	case randObject:
		b = append(b, '{')
		for i, j := range rng.Perm(len(v)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = randomSpace(rng, b)
			b = renderString(rng, b, v[j].key)
			b = randomSpace(rng, b)
			b = append(b, ':')
			b = renderValue(rng, b, v[j].val)
		}
		b = randomSpace(rng, b)
		b = append(b, '}')
	case stringValue:
		b = renderString(rng, b, string(v))
	}
	return randomSpace(rng, b)
}

// stringValue is a JSON string in a random value (a plain Go string there
// is a literal: true, false or null).
type stringValue string

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

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[1,2,{"d":null,"c":true}]}`,
		benchBody,
		`"\u00e9\/\ud83d\ude00\u003c"`,
		`[1,1.0,1e0,10e-1,-0,0.0,1E+2,12345678901234567890.5,1e400,1e-400]`,
		`{"a":1,"a":2}`,
		`{"\u0061":1,"a":2}`,
		`"\ud800"`,
		"\"\xff\"",
		`[01]`,
		`{"a":[1,]}`,
		strings.Repeat("[", 129) + strings.Repeat("]", 129),
		`{"z":{"y":{"x":1,"w":2},"v":[{"u":1,"t":2}]},"s":0}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		c, err := CanonicalJSON(nil, src)
		checkAgainstEncodingJSON(t, src, c, err)
		if err == nil {
			checkCanonical(t, src, c)
		}
	})
}

// numberText writes the value (-1)^neg × digits × 10^exp as a JSON number in
// one of many forms chosen by form: leading and trailing zeros added, the
// decimal point moved, the exponent spelt e or E, with or without '+' and
// leading zeros, or left out when it is 0.
func numberText(neg bool, digits string, exp int, form uint32) string {
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

// fuzzDigits turns arbitrary bytes into a digit string of at most 60 digits.
func fuzzDigits(b []byte) string {
	if len(b) > 60 {
		b = b[:60]
	}
	d := make([]byte, len(b))
	for i, c := range b {
		d[i] = '0' + c%10
	}
	if len(d) == 0 {
		return "0"
	}
	return string(d)
}

func ratOf(t *testing.T, s string) *big.Rat {
	t.Helper()
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		t.Fatalf("big.Rat cannot read %q", s)
	}
	return r
}

func FuzzNumberEquivalence(f *testing.F) {
	f.Add([]byte{1}, int16(0), false, uint32(0), uint32(1<<6|1<<3), []byte{1}, int16(1))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 5}, int16(-1), false, uint32(0), uint32(5<<6|3<<3|2), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0}, int16(0))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1}, int16(0), true, uint32(1<<14), uint32(1<<15|1<<16|2<<17), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 5}, int16(-1))
	f.Add([]byte{0}, int16(7), true, uint32(7), uint32(2<<6), []byte{0}, int16(-3))
	f.Add([]byte{1}, int16(400), false, uint32(0), uint32(3<<3|2<<6), []byte{1}, int16(-400))
	f.Add([]byte{9, 9, 9}, int16(18), false, uint32(1<<6), uint32(3<<6|7), []byte{1}, int16(21))
	f.Add([]byte{1, 5}, int16(-8), true, uint32(0), uint32(2<<6|5), []byte{1, 5}, int16(-7))
	f.Fuzz(func(t *testing.T, d1 []byte, e1 int16, neg bool, formA, formB uint32, d2 []byte, e2 int16) {
		digits, exp := fuzzDigits(d1), int(e1)%500
		a := numberText(neg, digits, exp, formA)
		b := numberText(neg, digits, exp, formB)
		ca, err := canonical(a)
		if err != nil {
			t.Fatalf("CanonicalJSON(%s): %v", a, err)
		}
		cb, err := canonical(b)
		if err != nil {
			t.Fatalf("CanonicalJSON(%s): %v", b, err)
		}
		if ca != cb {
			t.Fatalf("%s -> %s, %s -> %s: the same value, different forms", a, ca, b, cb)
		}
		want := ratOf(t, a)
		if got := ratOf(t, ca); got.Cmp(want) != 0 {
			t.Fatalf("%s -> %s: value changed", a, ca)
		}
		if cc, err := canonical(ca); err != nil || cc != ca {
			t.Fatalf("%s -> %s -> %s, %v: not idempotent", a, ca, cc, err)
		}
		if !json.Valid([]byte(ca)) {
			t.Fatalf("%s -> %s: not valid JSON", a, ca)
		}
		// Another value, in yet another form.
		c := numberText(!neg == (e2&1 == 1), fuzzDigits(d2), int(e2)%500, formA^formB)
		cc, err := canonical(c)
		if err != nil {
			t.Fatalf("CanonicalJSON(%s): %v", c, err)
		}
		if equal := ratOf(t, c).Cmp(want) == 0; equal != (cc == ca) {
			t.Fatalf("%s -> %s, %s -> %s: values equal %v, forms equal %v", a, ca, c, cc, equal, cc == ca)
		}
	})
}

func newRequest(contentType string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/orders/1", nil)
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return r
}

func fp(t *testing.T, f Fingerprinter, contentType, scope, body string) []byte {
	t.Helper()
	got, err := f(newRequest(contentType), scope, []byte(body))
	if err != nil {
		t.Fatalf("fingerprint: %v", err)
	}
	if len(got) != sha256.Size {
		t.Fatalf("fingerprint has %d bytes, want %d", len(got), sha256.Size)
	}
	return got
}

// wantFingerprint builds the documented preimage of a request from
// newRequest (POST /orders/1, no query) by hand.
func wantFingerprint(scope string, kind byte, form string) []byte {
	return preimageHash(scope, "POST", "/orders/1", "", 'q', "", kind, form)
}

// preimageHash builds the documented preimage by hand and hashes it.
func preimageHash(scope, method, path, rawPath string, qkind byte, query string, kind byte, form string) []byte {
	part := func(p []byte, s string) []byte {
		p = binary.BigEndian.AppendUint64(p, uint64(len(s)))
		return append(p, s...)
	}
	p := []byte("idem/fp/v2\n")
	p = part(p, scope)
	p = part(p, method)
	p = part(p, path)
	p = part(p, rawPath)
	p = append(p, qkind)
	p = part(p, query)
	p = append(p, kind)
	p = append(p, form...)
	sum := sha256.Sum256(p)
	return sum[:]
}

func TestDefaultFingerprintFormat(t *testing.T) {
	const scope = "POST /orders/:id"
	for _, tt := range []struct {
		name, contentType, body string
		kind                    byte
		form                    string
	}{
		{"ok, JSON hashed in canonical form", "application/json", `{ "b": 1.0, "a": "\u00e9" }`, 'j', `{"a":"é","b":1}`},
		{"ok, invalid JSON hashed raw", "application/json", `{"b":1,}`, 'r', `{"b":1,}`},
		{"ok, form hashed in canonical form", "application/x-www-form-urlencoded", "b=2&a=x+y&a=%7e", 'f', "a=x+y&a=~&b=2"},
		{"ok, text hashed raw", "text/plain", "hello", 'r', "hello"},
		{"ok, empty body", "application/json", "", 'e', ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := fp(t, DefaultFingerprint, tt.contentType, scope, tt.body)
			if want := wantFingerprint(scope, tt.kind, tt.form); !bytes.Equal(got, want) {
				t.Fatalf("got %x, want %x", got, want)
			}
		})
	}
	// The format is persisted in stores: changing it turns every retry
	// across an upgrade into a mismatch. This pins it.
	got := fp(t, DefaultFingerprint, "application/json", "POST /orders", `{"amount":1.50,"currency":"eur"}`)
	if want := "f1ec6442"; fmt.Sprintf("%x", got)[:8] != want {
		t.Fatalf("fingerprint format changed: got %x, want prefix %s", got, want)
	}
}

func TestDefaultFingerprint(t *testing.T) {
	const scope = "POST /orders/:id"
	const json1 = `{"amount":1000,"currency":"eur","items":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}`
	const json2 = "{\n  \"items\": [ {\"qty\": 1.0, \"sku\": \"a\"}, {\"qty\": 2, \"sku\": \"\\u0062\"} ],\n  \"currency\": \"eur\",\n  \"amount\": 1e3\n}"
	same := []struct {
		name                   string
		ctA, bodyA, ctB, bodyB string
		scopeB                 string
	}{
		{"ok, reformatted JSON agrees", "application/json", json1, "application/json", json2, ""},
		{"ok, content type is case-insensitive", "application/json", json1, "Application/JSON", json2, ""},
		{"ok, charset parameter ignored", "application/json", json1, "application/json; charset=utf-8", json2, ""},
		{"ok, +json suffix is JSON", "application/json", json1, "application/vnd.api+json", json2, ""},
		{"ok, merge-patch+json is JSON", "application/json", json1, "application/merge-patch+json; charset=UTF-8", json2, ""},
		{"ok, bad parameter still JSON", "application/json", json1, "application/json; charset", json2, ""},
		{"ok, form fields reordered agree", "application/x-www-form-urlencoded", "a=1&b=2&c=3", "application/x-www-form-urlencoded", "c=3&a=1&b=2", ""},
		{"ok, form escapes agree", "application/x-www-form-urlencoded", "name=J%C3%B6rg+M&x=%2F", "application/x-www-form-urlencoded; charset=utf-8", "x=/&name=J%c3%b6rg%20M", ""},
		{"ok, empty bodies agree across types", "application/json", "", "text/plain", "", ""},
		{"ok, same raw text", "text/plain", "hello", "text/plain", "hello", ""},
		{"ok, no content type is raw", "text/plain", "hello", "", "hello", ""},
		{"ok, invalid JSON raw like text", "application/json", "{nope", "text/plain", "{nope", ""},
	}
	for _, tt := range same {
		t.Run(tt.name, func(t *testing.T) {
			scopeB := scope
			if tt.scopeB != "" {
				scopeB = tt.scopeB
			}
			a := fp(t, DefaultFingerprint, tt.ctA, scope, tt.bodyA)
			b := fp(t, DefaultFingerprint, tt.ctB, scopeB, tt.bodyB)
			if !bytes.Equal(a, b) {
				t.Fatalf("fingerprints differ: %x vs %x", a, b)
			}
		})
	}
	differ := []struct {
		name                   string
		ctA, bodyA, ctB, bodyB string
		scopeB                 string
	}{
		{"nok, different scope", "application/json", json1, "application/json", json1, "POST /refunds/:id"},
		{"nok, scope and body do not run together", "text/plain", "ab", "text/plain", "b", scope + "a"},
		{"nok, different JSON value", "application/json", `{"amount":1000}`, "application/json", `{"amount":1000.5}`, ""},
		{"nok, 12345678901234567890.5 vs neighbour", "application/json", `{"n":12345678901234567890.5}`, "application/json", `{"n":12345678901234567891}`, ""},
		{"nok, JSON reformatted but sent as text", "text/plain", json1, "text/plain", json2, ""},
		{"nok, invalid JSON differs from canonical of anything", "application/json", `{"a":1}`, "application/json", `{"a":1`, ""},
		{"nok, raw bytes equal to a canonical form differ from it", "application/json", `{"a":1}`, "text/plain", `{"a":1}`, ""},
		{"nok, duplicate keys hashed raw", "application/json", `{"a":1}`, "application/json", `{"a":1,"a":1}`, ""},
		{"nok, form repeated values order matters", "application/x-www-form-urlencoded", "a=1&a=2", "application/x-www-form-urlencoded", "a=2&a=1", ""},
		{"nok, form vs same text", "application/x-www-form-urlencoded", "a=1&b=2", "text/plain", "a=1&b=2", ""},
		{"nok, invalid form hashed raw", "application/x-www-form-urlencoded", "a=1&b=2", "application/x-www-form-urlencoded", "b=2&a=1;c=3", ""},
		{"nok, multipart is raw", "multipart/form-data; boundary=x", "--x\r\nA\r\n--x--", "multipart/form-data; boundary=x", "--x\r\nB\r\n--x--", ""},
		{"nok, +json needs a subtype", "application/json", `{"a":1}`, "application/+json", ` {"a":1}`, ""},
		{"nok, empty body vs empty JSON string", "application/json", "", "application/json", `""`, ""},
	}
	for _, tt := range differ {
		t.Run(tt.name, func(t *testing.T) {
			scopeB := scope
			if tt.scopeB != "" {
				scopeB = tt.scopeB
			}
			a := fp(t, DefaultFingerprint, tt.ctA, scope, tt.bodyA)
			b := fp(t, DefaultFingerprint, tt.ctB, scopeB, tt.bodyB)
			if bytes.Equal(a, b) {
				t.Fatalf("fingerprints agree: %x", a)
			}
		})
	}
}

func TestDefaultFingerprintNilRequest(t *testing.T) {
	got, err := DefaultFingerprint(nil, "s", []byte("x"))
	if err != nil || !bytes.Equal(got, preimageHash("s", "", "", "", 'q', "", 'r', "x")) {
		t.Fatalf("got %x, %v", got, err)
	}
}

func TestDefaultFingerprintDoesNotRetainBody(t *testing.T) {
	body := []byte(`{"b":{"d":1,"c":2},"a":"secret"}`)
	orig := append([]byte(nil), body...)
	r := newRequest("application/json")
	first, _ := DefaultFingerprint(r, "s", body)
	for i := range body {
		body[i] = 'x'
	}
	// Run again on other bodies, so a pooled buffer would be reused.
	for range 10 {
		_, _ = DefaultFingerprint(r, "s", []byte(`{"z":[1,2,3],"y":{"b":1,"a":2}}`))
	}
	again, _ := DefaultFingerprint(r, "s", orig)
	if !bytes.Equal(first, again) {
		t.Fatalf("fingerprint changed: %x vs %x", first, again)
	}
	s := getScratch()
	_ = s.c.parse(orig, nil)
	s.release()
	if s.c.src != nil {
		t.Fatal("released scratch still references the input")
	}
	c, _ := CanonicalJSON(nil, orig)
	if len(c) > 0 && &c[0] == &orig[0] {
		t.Fatal("CanonicalJSON output aliases its input")
	}
}

func TestFingerprintFields(t *testing.T) {
	const scope = "POST /payments"
	f := FingerprintFields("amount", "currency")
	same := []struct{ name, ct, a, b string }{
		{"ok, other fields ignored", "application/json", `{"amount":100,"currency":"eur","note":"x"}`, `{"currency":"eur","amount":100,"note":"y","extra":[1]}`},
		{"ok, selected values canonical", "application/json", `{"amount":100,"currency":"eur"}`, `{"amount":1e2,"currency":"\u0065ur"}`},
		{"ok, nested selected value canonical", "application/json", `{"amount":{"b":1,"a":2}}`, `{"amount":{"a":2.0,"b":1}}`},
		{"ok, form other fields ignored", "application/x-www-form-urlencoded", "amount=100&currency=eur&note=x", "note=y&currency=eur&amount=100"},
		{"ok, same as default on selected fields", "application/json", `{"amount":100,"currency":"eur"}`, `{"amount":100,"currency":"eur","x":1}`},
	}
	for _, tt := range same {
		t.Run(tt.name, func(t *testing.T) {
			a, b := fp(t, f, tt.ct, scope, tt.a), fp(t, f, tt.ct, scope, tt.b)
			if !bytes.Equal(a, b) {
				t.Fatalf("fingerprints differ: %x vs %x", a, b)
			}
		})
	}
	t.Run("ok, equals DefaultFingerprint of the narrowed body", func(t *testing.T) {
		a := fp(t, f, "application/json", scope, `{"note":1,"currency":"eur","amount":100}`)
		b := fp(t, DefaultFingerprint, "application/json", scope, `{"amount":100,"currency":"eur"}`)
		if !bytes.Equal(a, b) {
			t.Fatalf("fingerprints differ: %x vs %x", a, b)
		}
	})
	differ := []struct{ name, ct, a, b string }{
		{"nok, selected field differs", "application/json", `{"amount":100,"currency":"eur"}`, `{"amount":101,"currency":"eur"}`},
		{"nok, missing field differs from null", "application/json", `{"amount":100}`, `{"amount":100,"currency":null}`},
		{"nok, form selected field differs", "application/x-www-form-urlencoded", "amount=100&note=x", "amount=200&note=x"},
		{"nok, top-level array hashed raw", "application/json", `[1, 2]`, `[1,2]`},
		{"nok, invalid JSON hashed raw", "application/json", `{"amount":100,}`, `{"amount":100 ,}`},
		{"nok, text hashed raw", "text/plain", `amount=1`, `amount=1 `},
	}
	for _, tt := range differ {
		t.Run(tt.name, func(t *testing.T) {
			a, b := fp(t, f, tt.ct, scope, tt.a), fp(t, f, tt.ct, scope, tt.b)
			if bytes.Equal(a, b) {
				t.Fatalf("fingerprints agree: %x", a)
			}
		})
	}
	t.Run("ok, no fields: every object agrees", func(t *testing.T) {
		none := FingerprintFields()
		a := fp(t, none, "application/json", scope, `{"a":1}`)
		b := fp(t, none, "application/json", scope, `{"b":2}`)
		if !bytes.Equal(a, b) {
			t.Fatalf("fingerprints differ: %x vs %x", a, b)
		}
	})
	t.Run("ok, top-level array falls back like DefaultFingerprint", func(t *testing.T) {
		a := fp(t, f, "application/json", scope, `[1]`)
		if want := wantFingerprint(scope, 'r', `[1]`); !bytes.Equal(a, want) {
			t.Fatalf("got %x, want %x", a, want)
		}
	})
}

const benchBody = `{
  "customer_id": "cus_9s6XKzkNRiz8i3",
  "amount": 2500,
  "currency": "eur",
  "description": "Order #1042 \u2013 2 items",
  "metadata": {"order_id": "1042", "channel": "web"},
  "items": [
    {"sku": "SKU-123", "quantity": 1, "price": 1250.00},
    {"sku": "SKU-456", "quantity": 1, "price": 12.5e2}
  ],
  "capture": true
}`

func BenchmarkCanonicalJSON(b *testing.B) {
	src := []byte(benchBody)
	dst := make([]byte, 0, len(src))
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = CanonicalJSON(dst[:0], src); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDefaultFingerprint(b *testing.B) {
	for _, bc := range []struct{ name, ct, body string }{
		{"json", "application/json", benchBody},
		{"form", "application/x-www-form-urlencoded", "customer_id=cus_9s6XKzkNRiz8i3&amount=2500&currency=eur&description=Order+%231042&capture=true"},
		{"raw", "text/plain", benchBody},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := newRequest(bc.ct)
			body := []byte(bc.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DefaultFingerprint(r, "POST /orders/:id", body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkCanonicalJSONLarge(b *testing.B) {
	var sb strings.Builder
	sb.WriteByte('[')
	for i := range 2000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"z":%d,"y":"%d\u00e9","x":[1.50,2e3,{"b":1,"a":2}]}`, i, i)
	}
	sb.WriteByte(']')
	src := []byte(sb.String())
	dst := make([]byte, 0, len(src))
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = CanonicalJSON(dst[:0], src); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDefaultFingerprintRequest: the fingerprint covers the method, the
// escaped path and the query (sorted by name, repeated values in order)
// besides the scope and the body.
func TestDefaultFingerprintRequest(t *testing.T) {
	const scope = "POST /orders/:id/payments"
	at := func(method, target string) []byte {
		t.Helper()
		r := httptest.NewRequest(method, target, nil)
		r.Header.Set("Content-Type", "application/json")
		got, err := DefaultFingerprint(r, scope, []byte(`{"amount":1}`))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	same := []struct{ name, a, b string }{
		{"ok, parameters sorted by name", "/orders/1/payments?a=1&b=2", "/orders/1/payments?b=2&a=1"},
		{"ok, query escapes decoded", "/orders/1/payments?note=a+b&x=%2F", "/orders/1/payments?x=/&note=a%20b"},
		{"ok, empty query and none", "/orders/1/payments?", "/orders/1/payments"},
		{"ok, empty segments of the query ignored", "/orders/1/payments?a=1&&b=2", "/orders/1/payments?a=1&b=2"},
	}
	for _, tt := range same {
		t.Run(tt.name, func(t *testing.T) {
			if a, b := at("POST", tt.a), at("POST", tt.b); !bytes.Equal(a, b) {
				t.Fatalf("%s and %s: fingerprints differ", tt.a, tt.b)
			}
		})
	}
	differ := []struct{ name, methodB, a, b string }{
		{"nok, another resource", "POST", "/orders/1/payments", "/orders/2/payments"},
		{"nok, another query value", "POST", "/orders/1/payments?dry_run=true", "/orders/1/payments?dry_run=false"},
		{"nok, a query and none", "POST", "/orders/1/payments?dry_run=true", "/orders/1/payments"},
		{"nok, repeated values in another order", "POST", "/orders/1/payments?tag=a&tag=b", "/orders/1/payments?tag=b&tag=a"},
		{"nok, an escaped slash is not a slash", "POST", "/files/a%2Fb", "/files/a/b"},
		{"nok, a path escaped otherwise", "POST", "/files/a\"b", "/files/a%22b"},
		{"nok, unparseable query hashed raw", "POST", "/orders/1/payments?a=1;b=2", "/orders/1/payments?a=1&b=2"},
		{"nok, unparseable queries differ raw", "POST", "/orders/1/payments?a=1;b=2", "/orders/1/payments?b=2;a=1"},
		{"nok, another method", "PATCH", "/orders/1/payments", "/orders/1/payments"},
		{"nok, query name and value not run together", "POST", "/orders/1/payments?ab=c", "/orders/1/payments?a=bc"},
	}
	for _, tt := range differ {
		t.Run(tt.name, func(t *testing.T) {
			if a, b := at("POST", tt.a), at(tt.methodB, tt.b); bytes.Equal(a, b) {
				t.Fatalf("POST %s and %s %s: fingerprints agree", tt.a, tt.methodB, tt.b)
			}
		})
	}
	t.Run("ok, matches the documented preimage", func(t *testing.T) {
		got := at("POST", "/orders/1/payments?b=2&a=x+y")
		want := preimageHash(scope, "POST", "/orders/1/payments", "", 'q', "a=x+y&b=2", 'j', `{"amount":1}`)
		if !bytes.Equal(got, want) {
			t.Fatalf("got %x, want %x", got, want)
		}
		got = at("POST", "/a%2Fb?a=1;b")
		want = preimageHash(scope, "POST", "/a/b", "/a%2Fb", 'r', "a=1;b", 'j', `{"amount":1}`)
		if !bytes.Equal(got, want) {
			t.Fatalf("raw query: got %x, want %x", got, want)
		}
	})
	// Every part is framed: moving bytes from one part to the next changes
	// the fingerprint.
	t.Run("nok, parts never run together", func(t *testing.T) {
		req := func(method, path, query string) *http.Request {
			return &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{}}
		}
		fps := map[string]string{}
		for _, c := range []struct {
			scope string
			r     *http.Request
			body  string
		}{
			{"s", req("POST", "/a", "b=c"), "d"},
			{"sPOST", req("", "/a", "b=c"), "d"},
			{"s", req("POST/a", "", "b=c"), "d"},
			{"s", req("POST", "/ab=c", ""), "d"},
			{"s", req("POST", "/a", ""), "b=cd"},
			{"s", req("POST", "/a", "b=cd"), ""},
			{"s", nil, "POST/ab=cd"},
		} {
			got, _ := DefaultFingerprint(c.r, c.scope, []byte(c.body))
			name := fmt.Sprintf("%q %v %q", c.scope, c.r, c.body)
			if c.r != nil {
				name = fmt.Sprintf("%q %q %q %q %q", c.scope, c.r.Method, c.r.URL.Path, c.r.URL.RawQuery, c.body)
			}
			if prev, ok := fps[string(got)]; ok {
				t.Fatalf("%s and %s: fingerprints agree", prev, name)
			}
			fps[string(got)] = name
		}
	})
}

// TestFingerprintCollidingNames: bodies that encoding/json reads
// differently because names collide case-insensitively (last wins) never
// share a fingerprint; DefaultFingerprint and FingerprintFields alike.
func TestFingerprintCollidingNames(t *testing.T) {
	const scope = "POST /orders"
	for _, f := range []struct {
		name string
		fp   Fingerprinter
	}{{"DefaultFingerprint", DefaultFingerprint}, {"FingerprintFields", FingerprintFields("item", "quantity", "a", "k")}} {
		t.Run(f.name, func(t *testing.T) {
			for _, tt := range []struct{ name, a, b string }{
				{"nok, names equal but for case reordered", `{"item":"tea","quantity":1,"Quantity":9}`, `{"item":"tea","Quantity":9,"quantity":1}`},
				{"nok, a repeated name reordered", `{"a":1,"a":2}`, `{"a":2,"a":1}`},
				{"nok, names equal after unescaping reordered", `{"a":1,"\u0041":2}`, `{"\u0041":2,"a":1}`},
				{"nok, Kelvin sign and k reordered", `{"a":0,"k":1,"\u212a":2}`, `{"a":0,"\u212a":2,"k":1}`},
			} {
				t.Run(tt.name, func(t *testing.T) {
					a, b := fp(t, f.fp, "application/json", scope, tt.a), fp(t, f.fp, "application/json", scope, tt.b)
					if bytes.Equal(a, b) {
						t.Fatalf("%s and %s: fingerprints agree", tt.a, tt.b)
					}
					if _, _, ok := sameStruct([]byte(tt.a), []byte(tt.b)); ok {
						t.Fatalf("%s and %s: a struct reads them alike; the test is void", tt.a, tt.b)
					}
				})
			}
			for _, tt := range []struct{ name, a, b string }{
				{"ok, colliding names in order, others moved", `{"item":"tea","quantity":1,"Quantity":9}`, `{"quantity":1,"Quantity":9,"item":"tea"}`},
				{"ok, colliding names interleaved with others", `{"a":1,"item":"tea","A":2}`, `{"item":"tea","a":1,"A":2}`},
			} {
				t.Run(tt.name, func(t *testing.T) {
					a, b := fp(t, f.fp, "application/json", scope, tt.a), fp(t, f.fp, "application/json", scope, tt.b)
					if !bytes.Equal(a, b) {
						t.Fatalf("%s and %s: fingerprints differ", tt.a, tt.b)
					}
				})
			}
		})
	}
	t.Run("nok, FingerprintFields keeps names that match a field but for case", func(t *testing.T) {
		f := FingerprintFields("amount")
		a := fp(t, f, "application/json", scope, `{"Amount":1}`)
		b := fp(t, f, "application/json", scope, `{"Amount":2}`)
		if bytes.Equal(a, b) {
			t.Fatal("Amount is read into a field amount, yet 1 and 2 agree")
		}
		c := fp(t, f, "application/json", scope, `{"amount":1,"AMOUNT":2}`)
		d := fp(t, f, "application/json", scope, `{"AMOUNT":2,"amount":1}`)
		if bytes.Equal(c, d) {
			t.Fatal("colliding selected names reordered, yet the fingerprints agree")
		}
	})
}

func TestCountColons(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
	}{
		{`{"a":1,"b":{"c":2}}`, 3},
		{`{"a:b":"c:d"}`, 1},
		{`{"a\":":1}`, 1},
		{`{"a\\":1}`, 1},
		{`{"a\\\":b":1}`, 1},
		{`["\\\\",":",{"x":1}]`, 1},
		{`{"unterminated:`, 0},
		{`::`, 2},
	} {
		if got := countColons([]byte(tt.in)); got != tt.want {
			t.Errorf("countColons(%s) = %d, want %d", tt.in, got, tt.want)
		}
	}
}
