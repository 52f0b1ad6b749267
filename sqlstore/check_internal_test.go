package sqlstore

import "testing"

func TestVersionLess(t *testing.T) {
	for _, c := range []struct {
		version string
		min     [2]int
		less    bool
	}{
		{"10.11.14", [2]int{10, 6}, false},
		{"10.5.2", [2]int{10, 6}, true},
		{"15.18", [2]int{12, 0}, false},
		{"11.4", [2]int{12, 0}, true},
		{"3.34.1", [2]int{3, 35}, true},
		{"3.54.1", [2]int{3, 35}, false},
		{"8.0.35", [2]int{8, 0}, false},
		{"5.7.44", [2]int{8, 0}, true},
		{"16beta1", [2]int{12, 0}, false}, // unreadable: not refused
	} {
		if got := versionLess(c.version, c.min); got != c.less {
			t.Errorf("versionLess(%q, %v) = %v, want %v", c.version, c.min, got, c.less)
		}
	}
}
