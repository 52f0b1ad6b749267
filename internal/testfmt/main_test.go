package main

import (
	"strings"
	"testing"
)

const stream = `{"Action":"start","Package":"example.com/a"}
{"Action":"run","Package":"example.com/a","Test":"TestOK"}
{"Action":"output","Package":"example.com/a","Test":"TestOK","Output":"quiet\n"}
{"Action":"pass","Package":"example.com/a","Test":"TestOK","Elapsed":0.1}
{"Action":"run","Package":"example.com/a","Test":"TestBad"}
{"Action":"output","Package":"example.com/a","Test":"TestBad","Output":"    a_test.go:9: want 2\n"}
{"Action":"fail","Package":"example.com/a","Test":"TestBad","Elapsed":0.2}
{"Action":"fail","Package":"example.com/a","Elapsed":1.5}
go: downloading example.com/b v1.0.0
{"Action":"start","Package":"example.com/b"}
{"Action":"pass","Package":"example.com/b","Elapsed":2}
`

func TestRun(t *testing.T) {
	var out strings.Builder
	if code := run(strings.NewReader(stream), &out, false, 0); code != 1 {
		t.Errorf("exit %d, want 1 (a test failed)", code)
	}
	got := out.String()
	for _, want := range []string{"    start example.com/a\n", "      a_test.go:9: want 2\n", "    FAIL  example.com/a 1.5s\n", "go: downloading example.com/b v1.0.0\n", "    ok    example.com/b 2.0s\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet") {
		t.Errorf("a passing test's output was printed without -v:\n%s", got)
	}

	out.Reset()
	pass := strings.Join(strings.Split(stream, "\n")[8:], "\n")
	if code := run(strings.NewReader(pass), &out, false, 0); code != 0 {
		t.Errorf("exit %d for a passing stream, want 0:\n%s", code, out.String())
	}
}
