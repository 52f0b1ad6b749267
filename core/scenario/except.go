package scenario

import (
	"slices"
	"testing"
)

// Except leaves the scenarios named out of a run, for an adapter whose
// framework has no way to express what they check (Fiber has no
// synchronous Hijack: fasthttp hands the connection over after the
// handler returns). reason says why; each scenario left out is reported
// as skipped with it, so go test -v lists them. A name that matches no
// scenario of the run fails it: an exception cannot outlive its scenario.
func Except(reason string, names ...string) Option {
	return optionFunc(func(o *options) {
		if o.except == nil {
			o.except = map[string]string{}
		}
		for _, n := range names {
			o.except[n] = reason
		}
	})
}

// check fails t for an exception that names no scenario of list.
func (o *options) check(t *testing.T, list []scenario) {
	t.Helper()
	for _, name := range o.unknown(list) {
		t.Errorf("scenario.Except(%q): no such scenario in this run", name)
	}
}

// unknown returns the exceptions that name no scenario of list, sorted.
func (o *options) unknown(list []scenario) []string {
	var names []string
	for name := range o.except {
		if !slices.ContainsFunc(list, func(s scenario) bool { return s.name == name }) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
