package main

import (
	"fmt"
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

// A timeout's dump is filed under the last test that started, which never
// ends; the package's failure must still print it, and of its goroutines
// those in the project's code.
const timeout = `{"Action":"start","Package":"example.com/a"}
{"Action":"run","Package":"example.com/a","Test":"TestQuick"}
{"Action":"pass","Package":"example.com/a","Test":"TestQuick","Elapsed":0.1}
{"Action":"run","Package":"example.com/a","Test":"TestHang"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"panic: test timed out after 10m0s\n"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"\trunning tests:\n"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"\t\tTestHang (10m0s)\n"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"\n"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"goroutine 7 [select]:\n"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"github.com/idemkit/idem/core.(*call).wait(...)\n"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"\n"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"goroutine 9 [IO wait]:\n"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"internal/poll.runtime_pollWait(...)\n"}
{"Action":"output","Package":"example.com/a","Test":"TestHang","Output":"\n"}
{"Action":"output","Package":"example.com/a","Output":"FAIL\texample.com/a\t600.0s\n"}
{"Action":"fail","Package":"example.com/a","Elapsed":600}
`

func TestRunTimeout(t *testing.T) {
	var out strings.Builder
	if code := run(strings.NewReader(timeout), &out, false, 0); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	got := out.String()
	for _, want := range []string{"--- unfinished: TestHang\n", "panic: test timed out after 10m0s\n", "\t\tTestHang (10m0s)\n", "core.(*call).wait", "(1 goroutines outside github.com/idemkit left out)\n", "FAIL  example.com/a 600.0s\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "runtime_pollWait") || strings.Contains(got, "TestQuick") {
		t.Errorf("an idle goroutine or a passed test was printed:\n%s", got)
	}
}

// A hung test that logged much keeps its log's head and tail: the panic
// that ends it and the names of the tests still running are not lost.
func TestDumpLongLog(t *testing.T) {
	var lines []string
	for i := range 1000 {
		lines = append(lines, fmt.Sprintf("    a_test.go:9: line %d\n", i))
	}
	lines = append(lines, "panic: test timed out after 10m0s\n", "\trunning tests:\n", "\t\tTestHang (10m0s)\n", "\n",
		"goroutine 7 [select]:\n", "github.com/idemkit/idem/core.(*call).wait(...)\n", "\n")
	got := strings.Join(dump(lines), "")
	for _, want := range []string{"line 0\n", "(704 lines of the test's log left out)\n", "panic: test timed out after 10m0s\n", "\t\tTestHang (10m0s)\n", "core.(*call).wait"} {
		if !strings.Contains(got, want) {
			t.Errorf("dump lacks %q", want)
		}
	}
	if strings.Contains(got, "line 500\n") {
		t.Errorf("dump kept the middle of the log")
	}
}
