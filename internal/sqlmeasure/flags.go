// Package sqlmeasure holds the flags of the measurements in idem's SQL
// store tests (sqlstore/dbtest, gormstore/dbtest, pgxstore), which turn
// the long runs on. It is internal: no user runs these measurements, and
// sqlstoretest exports only the suites a store author runs (and what their
// fixtures need, such as its statement Counter).
package sqlmeasure

import (
	"flag"
	"regexp"
)

// Flags of the measurements, registered in every test binary that imports
// this package (sqlstoretest does):
//
//	go test -run TestPool -v -stores.measure .      (in sqlstore/dbtest or gormstore/dbtest)
//	go test -run TestSweepMillion -v -stores.sweep1m -timeout 1h .   (in sqlstore/dbtest)
var (
	measure = flag.Bool("stores.measure", false, "measure with more samples and longer holds (sqlstoretest.RunPool, the MEASURE tests)")
	sweep1m = flag.Bool("stores.sweep1m", false, "sweep a million expired rows under concurrent claims (TestSweepMillion)")
	only    = flag.String("stores.only", "", "measure only the variants whose names match this regular expression (pgxstore TestMeasureStatements; the first variant, the baseline, always runs)")
)

// Measure reports whether -stores.measure is set.
func Measure() bool { return *measure }

// SweepMillion reports whether -stores.sweep1m is set.
func SweepMillion() bool { return *sweep1m }

// Only reports whether the variant name is to be measured (-stores.only;
// every variant when the flag is empty). A bad expression panics: the
// flag is for a person at a terminal.
func Only(name string) bool {
	return *only == "" || regexp.MustCompile(*only).MatchString(name)
}
