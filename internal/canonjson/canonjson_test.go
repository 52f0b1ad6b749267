package canonjson

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/jsontest"
)

func canonical(s string) (string, error) {
	c, err := Append(nil, []byte(s))
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
		{"ok, top-level number", ` 1.0 `, `1.0`},
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

		// Numbers: as written (Go's decoders read 1, 1.0 and 1e0
		// differently: an integer field accepts only the first).
		{"ok, 1", `1`, `1`},
		{"ok, 1.0 kept", `1.0`, `1.0`},
		{"ok, 1.00 kept", `1.00`, `1.00`},
		{"ok, 1e0 kept", `1e0`, `1e0`},
		{"ok, 1E+0 kept", `1E+0`, `1E+0`},
		{"ok, 1e3 kept", `{"amount" : 1e3}`, `{"amount":1e3}`},
		{"ok, -0 kept", `-0`, `-0`},
		{"ok, 0.0 kept", `0.0`, `0.0`},
		{"ok, negative fraction kept", `-1.50`, `-1.50`},
		{"ok, exponent with leading zeros kept", `1e00000000000000000000000000`, `1e00000000000000000000000000`},
		{"ok, 20 digits integer", `12345678901234567890`, `12345678901234567890`},
		{"ok, 12345678901234567890.5 kept exactly", `12345678901234567890.5`, `12345678901234567890.5`},
		{"ok, 22 digits", `1234567890123456789012`, `1234567890123456789012`},
		{"ok, huge exponent kept", `1e999999999999`, `1e999999999999`},
		{"ok, exponent overflowing int64 kept", `-1.5e-99999999999999999999999999`, `-1.5e-99999999999999999999999999`},
		{"ok, numbers in arrays and objects", ` [ 1.0 , {"b":2e0,"a":-0.10} , 3 ] `, `[1.0,{"a":-0.10,"b":2e0},3]`},
		{"ok, long integer", long, long},
		{"ok, long fraction", "0." + long, "0." + long},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := canonical(tt.in)
			if err != nil {
				t.Fatalf("Append(%.80q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("Append(%.80q)\n got %.200q\nwant %.200q", tt.in, got, tt.want)
			}
			checkCanonical(t, []byte(tt.in), []byte(got))
		})
	}
}

func TestCanonicalJSONAppends(t *testing.T) {
	dst := []byte("prefix:")
	got, err := Append(dst, []byte(`{"b":1,"a":2}`))
	if err != nil || string(got) != `prefix:{"a":2,"b":1}` {
		t.Fatalf("got %q, %v", got, err)
	}
	got, err = Append(dst, []byte(`{"b":1,`))
	if err == nil || string(got) != "prefix:" {
		t.Fatalf("on error: got %q, %v; want dst unchanged and an error", got, err)
	}
	// The output may overwrite the input.
	src := []byte(`{ "b" : 1 , "a" : 2 }`)
	got, err = Append(src[:0], src)
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
		{"nok, two exponent signs", `1e+-5`, errJSONSyntax},
		{"nok, minus then point", `-.5`, errJSONSyntax},
		{"nok, point in the exponent", `1e5.0`, errJSONSyntax},
		{"nok, leading zero then digits with fraction", `00.5`, errJSONSyntax},
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

		{"nok, depth 129 arrays", deep(MaxDepth + 1), errJSONTooDeep},
		{"nok, depth 129 objects", deepObj(MaxDepth + 1), errJSONTooDeep},
		{"nok, depth 100000", deep(100000), errJSONTooDeep},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := canonical(tt.in)
			if err == nil {
				t.Fatalf("Append(%.80q) = %.80q, want an error", tt.in, got)
			}
			if !errors.Is(err, ErrInvalid) || !errors.Is(err, tt.reason) {
				t.Fatalf("Append(%.80q): %v, want ErrInvalid and %v", tt.in, err, tt.reason)
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
		{"ok, one number text, other whitespace and order", `{"n":1.0,"m":1e3}`, ` { "m" : 1e3 , "n" : 1.0 } `},
		{"ok, 12345678901234567890.5 twice", `[12345678901234567890.5]`, `[ 12345678901234567890.5 ]`},
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
		{"nok, 1e3 and 1000", `{"amount":1e3}`, `{"amount":1000}`},
		{"nok, 1 and 1.0", `1`, `1.0`},
		{"nok, 1 and 1e0", `1`, `1e0`},
		{"nok, 1 and 1.00", `1`, `1.00`},
		{"nok, 1.0 and 1e0", `1.0`, `1e0`},
		{"nok, 1.0 and 1.00", `1.0`, `1.00`},
		{"nok, 1e0 and 1.00", `1e0`, `1.00`},
		{"nok, 1e0 and 1E0", `1e0`, `1E0`},
		{"nok, 1e2 and 1e+2", `1e2`, `1e+2`},
		{"nok, -0 and 0", `-0`, `0`},
		{"nok, 0.5 and 5e-1", `0.5`, `5e-1`},
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
		c, err := Append(nil, []byte(in))
		if err != nil {
			t.Fatalf("Append(%q): %v", in, err)
		}
		checkCanonical(t, []byte(in), c)
	}
}

// checkCanonical checks the properties of c, the canonical form of src:
// Append(c) == c; c is valid JSON; c decodes to the same structure as
// src, numbers compared by their text; and encoding/json's own
// re-serialisation of src (indented, keys re-ordered, <>& escaped) has the
// same canonical form.
func checkCanonical(t *testing.T, src, c []byte) {
	t.Helper()
	if !json.Valid(c) {
		t.Fatalf("canonical form %.200q of %.200q is not valid JSON", c, src)
	}
	c2, err := Append(nil, c)
	if err != nil || !bytes.Equal(c, c2) {
		t.Fatalf("not idempotent: %.200q -> %.200q, %v", c, c2, err)
	}
	v1, err := jsontest.DecodeUseNumber(src)
	if err != nil {
		t.Fatalf("encoding/json cannot decode %.200q: %v", src, err)
	}
	v2, err := jsontest.DecodeUseNumber(c)
	if err != nil {
		t.Fatalf("encoding/json cannot decode %.200q: %v", c, err)
	}
	if path, ok := jsontest.SameJSON(v1, v2, "$"); !ok {
		t.Fatalf("canonical form %.200q of %.200q differs at %s", c, src, path)
	}
	if s1, s2, ok := jsontest.SameStruct(src, c); !ok {
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
	c3, err := Append(nil, re.Bytes())
	if err != nil || !bytes.Equal(c, c3) {
		t.Fatalf("re-serialised %.200q\n-> %.200q, %v\nwant %.200q", re.Bytes(), c3, err, c)
	}
}

// checkAgainstEncodingJSON checks that Append accepts src exactly when
// encoding/json does, except for what it refuses on purpose: nesting beyond MaxDepth, invalid UTF-8 and lone surrogates in strings
// (which encoding/json replaces with U+FFFD). Each
// such refusal is confirmed independently.
func checkAgainstEncodingJSON(t *testing.T, src, c []byte, err error) {
	t.Helper()
	valid := json.Valid(src)
	switch {
	case err == nil && !valid:
		t.Fatalf("Append accepts %.200q (-> %.200q), encoding/json does not", src, c)
	case err != nil && valid:
		var why string
		switch {
		case errors.Is(err, errJSONTooDeep):
			if depthOf(src) <= MaxDepth {
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
		default:
			why = "not one of the deliberate refusals"
		}
		if why != "" {
			t.Fatalf("Append refuses %.200q (%v) that encoding/json accepts: %s", src, err, why)
		}
	}
}

var surrogateEscape = regexp.MustCompile(`\\u[dD][89a-fA-F]`)

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
		c, err := Append(nil, []byte(in))
		checkAgainstEncodingJSON(t, []byte(in), c, err)
		if err == nil {
			checkCanonical(t, []byte(in), c)
		}
	}
}

// TestCanonicalJSONRandomDocuments writes random JSON values twice, each
// time with its own member order, whitespace and string escapes (numbers
// keep their text: it is part of the value), and checks that both texts
// have the same canonical form.
func TestCanonicalJSONRandomDocuments(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		v := jsontest.RandomValue(rng, 0)
		a := jsontest.RenderValue(rng, nil, v)
		b := jsontest.RenderValue(rng, nil, v)
		ca, err := Append(nil, a)
		if err != nil {
			t.Fatalf("document %d: Append(%.300q): %v", i, a, err)
		}
		cb, err := Append(nil, b)
		if err != nil {
			t.Fatalf("document %d: Append(%.300q): %v", i, b, err)
		}
		if !bytes.Equal(ca, cb) {
			t.Fatalf("document %d: one value, two forms:\n%.300q\n-> %.300q\n%.300q\n-> %.300q", i, a, ca, b, cb)
		}
		checkCanonical(t, a, ca)
	}
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
	var x Hasher // reused across inputs, as core reuses it
	f.Fuzz(func(t *testing.T, src []byte) {
		c, err := Append(nil, src)
		checkAgainstEncodingJSON(t, src, c, err)
		if err == nil {
			checkCanonical(t, src, c)
		}
		// Hash streams the same form through its buffer.
		h := sha256.New()
		if ok := x.Hash(h, []byte{'j'}, src, nil); ok != (err == nil) {
			t.Fatalf("Hash reported %v, Append's error is %v", ok, err)
		}
		if want := sha256.Sum256(append([]byte{'j'}, c...)); err == nil && !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("Hash of %q is not the hash of the tag and Append's form %q", src, c)
		}
	})
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

// FuzzNumberText: a number's canonical form is its text, whatever its
// value: two spellings of one value (1 and 1.0, 1e3 and 1000) are two
// documents, because Go's decoders read them differently (an integer field
// accepts only an integer literal), and one spelling always agrees with
// itself.
func FuzzNumberText(f *testing.F) {
	f.Add([]byte{1}, int16(0), false, uint32(0), uint32(1<<6|1<<3))
	f.Add([]byte{1}, int16(3), false, uint32(0), uint32(1<<14))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 5}, int16(-1), false, uint32(0), uint32(5<<6|3<<3|2))
	f.Add([]byte{0}, int16(7), true, uint32(7), uint32(2<<6))
	f.Add([]byte{1}, int16(400), false, uint32(0), uint32(3<<3|2<<6))
	f.Add([]byte{1, 5}, int16(-8), true, uint32(0), uint32(2<<6|5))
	f.Fuzz(func(t *testing.T, d []byte, e int16, neg bool, formA, formB uint32) {
		digits, exp := fuzzDigits(d), int(e)%500
		a := jsontest.NumberText(neg, digits, exp, formA)
		b := jsontest.NumberText(neg, digits, exp, formB)
		for _, n := range []string{a, b} {
			if !json.Valid([]byte(n)) {
				t.Fatalf("NumberText wrote %q, not JSON", n)
			}
			c, err := canonical(" " + n + "\n")
			if err != nil {
				t.Fatalf("Append(%s): %v", n, err)
			}
			if c != n {
				t.Fatalf("Append(%s) = %s, want the number as written", n, c)
			}
		}
		ca, _ := canonical(`{"n":` + a + `}`)
		cb, _ := canonical(`{"n":` + b + `}`)
		if (ca == cb) != (a == b) {
			t.Fatalf("%s -> %s, %s -> %s: forms equal %v, texts equal %v", a, ca, b, cb, ca == cb, a == b)
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

func BenchmarkCanonicalJSON(b *testing.B) { benchAppend(b, []byte(benchBody)) }

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
	benchAppend(b, []byte(sb.String()))
}

// BenchmarkHash measures Hasher.Hash into SHA-256, as core's fingerprint
// calls it: the working memory reused, the hash reset per document.
func BenchmarkHash(b *testing.B) {
	for _, bc := range []struct{ name, body string }{
		{"order", `{"item":"coffee","quantity":2,"note":"oat milk, extra hot","address":{"street":"1 Main St","city":"Springfield"}}`},
		{"payment", benchBody},
	} {
		b.Run(bc.name, func(b *testing.B) {
			src, h, x, tag := []byte(bc.body), sha256.New(), new(Hasher), []byte{'j'}
			b.SetBytes(int64(len(src)))
			b.ReportAllocs()
			for b.Loop() {
				h.Reset()
				if !x.Hash(h, tag, src, nil) {
					b.Fatal("not canonicalised")
				}
			}
		})
	}
}

// benchAppend measures Append of src into a buffer reused across
// iterations.
func benchAppend(b *testing.B, src []byte) {
	dst := make([]byte, 0, len(src))
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = Append(dst[:0], src); err != nil {
			b.Fatal(err)
		}
	}
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
