package scenario

import (
	"slices"
	"testing"
)

// TestExceptUnknown: an exception that names no scenario of the run is
// reported, so that none outlives the scenario it was written for.
func TestExceptUnknown(t *testing.T) {
	var o options
	Except("why", "LeasedHijack", "NoSuchScenario").apply(&o)
	if got := o.unknown(scenarios); !slices.Equal(got, []string{"NoSuchScenario"}) {
		t.Errorf("unknown = %v, want [NoSuchScenario]", got)
	}
	if got := o.unknown(nestedScenarios); !slices.Equal(got, []string{"LeasedHijack", "NoSuchScenario"}) {
		t.Errorf("unknown in the nested run = %v, want both", got)
	}
}
