package storetest_test

import (
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/storetest"
)

// TestConformance is the example of the package doc (doc.go), compiled and
// run; TestDocExample keeps the two the same.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return memstore.New() // your store here: a new, empty one per case
	})
}

// TestDocExample: the example in the package doc is TestConformance above,
// character for character, so the doc shows code that compiles and passes.
func TestDocExample(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var shown []string
	for _, line := range strings.Split(string(doc), "\n") {
		if code, ok := strings.CutPrefix(line, "//\t"); ok {
			shown = append(shown, code)
		} else if len(shown) > 0 {
			break // the first code block of the doc only
		}
	}
	src, err := os.ReadFile("doc_test.go")
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	start := strings.Index(s, "func TestConformance(")
	if start < 0 {
		t.Fatal("doc_test.go has no func TestConformance")
	}
	end := strings.Index(s[start:], "\n}\n")
	compiled := s[start : start+end+2]
	if got := strings.Join(shown, "\n"); got != compiled {
		t.Errorf("the package doc's example differs from TestConformance in doc_test.go: update doc.go\ndoc.go shows:\n%s\ndoc_test.go compiles:\n%s", got, compiled)
	}
}
