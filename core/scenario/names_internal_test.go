package scenario

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// camel is the shape of a scenario's name: one CamelCase word, so that
// go test -run selects it without quoting or escaping.
var camel = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)

// TestScenarioNames: every scenario of every suite has a CamelCase name,
// unique in its suite, and a rule sentence; a check run by more than one
// suite has one name everywhere.
func TestScenarioNames(t *testing.T) {
	byFunc := map[uintptr]string{}
	for suite, list := range map[string][]scenario{"Run": scenarios, "RunGlobal": globalScenarios, "RunNested": nestedScenarios, "RunRecovered": recoveredScenarios} {
		seen := map[string]bool{}
		for _, s := range list {
			if !camel.MatchString(s.name) {
				t.Errorf("%s: name %q is not one CamelCase word", suite, s.name)
			}
			if seen[s.name] {
				t.Errorf("%s: name %q twice", suite, s.name)
			}
			seen[s.name] = true
			if s.rule == "" || !strings.HasSuffix(s.rule, ".") {
				t.Errorf("%s: %s: the rule %q is not a sentence", suite, s.name, s.rule)
			}
			if s.modes&both == 0 {
				t.Errorf("%s: %s runs in no mode", suite, s.name)
			}
			fn := reflect.ValueOf(s.fn).Pointer()
			if other, ok := byFunc[fn]; ok && other != s.name {
				t.Errorf("%s: one check named %q here and %q in another suite", suite, s.name, other)
			}
			byFunc[fn] = s.name
		}
	}
}
