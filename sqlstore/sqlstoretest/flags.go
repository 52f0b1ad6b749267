package sqlstoretest

import "flag"

// Flags of the measurements, registered in every test binary that imports
// this package:
//
//	go test -run TestPool -v -stores.measure .      (in sqlstore/ or gormstore/)
//	go test -run TestSweepMillion -v -stores.sweep1m -timeout 1h .   (in sqlstore/)
var (
	measure = flag.Bool("stores.measure", false, "sqlstoretest: measure with more samples and longer holds (RunPool)")
	sweep1m = flag.Bool("stores.sweep1m", false, "sqlstoretest: sweep a million expired rows under concurrent claims (RunSweepMillion)")
)

// Measure reports whether -stores.measure is set.
func Measure() bool { return *measure }

// SweepMillion reports whether -stores.sweep1m is set.
func SweepMillion() bool { return *sweep1m }
