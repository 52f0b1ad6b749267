// Command testfmt reports a `go test -json` stream as it runs, for
// scripts/test.sh: a line when a package starts, a line when it ends (ok,
// FAIL or skipped, with its time), the output of every failed test and of
// a failed package (with the tests that never ended: a timeout's or a
// panic's dump, see dump), and, while packages run, a line every -every naming
// those still running and for how long, so that a long package never
// leaves the screen silent for minutes. Lines that are not JSON are
// printed as they are. With -v it prints every output line too.
//
//	go test -json ./... | testfmt [-v] [-every 60s]
//
// It exits 1 if a package or a test failed, 2 if the stream could not be
// read, else 0; test.sh still takes go test's own status (pipefail).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

func main() {
	verbose := flag.Bool("v", false, "print every output line")
	every := flag.Duration("every", time.Minute, "how often to name the packages still running (0: never)")
	flag.Parse()
	os.Exit(run(os.Stdin, os.Stdout, *verbose, *every))
}

// report is the state of the stream read so far.
type report struct {
	mu      sync.Mutex
	out     io.Writer
	verbose bool
	running map[string]time.Time // package → when it started
	output  map[string][]string  // package or package+test → its output lines, until it passes
	order   []string             // the keys of output, in the order first seen
	failed  bool
}

func run(in io.Reader, out io.Writer, verbose bool, every time.Duration) int {
	r := &report{out: out, verbose: verbose, running: map[string]time.Time{}, output: map[string][]string{}}
	if every > 0 {
		stop := make(chan struct{})
		defer close(stop)
		go r.tick(every, stop)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		r.line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testfmt: reading the stream: %v\n", err)
		return 2
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed {
		return 1
	}
	return 0
}

func (r *report) line(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ev event
	if !strings.HasPrefix(s, "{") || json.Unmarshal([]byte(s), &ev) != nil {
		fmt.Fprintln(r.out, s)
		return
	}
	key := ev.Package + " " + ev.Test
	switch ev.Action {
	case "start":
		r.running[ev.Package] = time.Now()
		fmt.Fprintf(r.out, "    start %s\n", ev.Package)
	case "output", "build-output":
		if r.verbose {
			fmt.Fprint(r.out, ev.Output)
		}
		if _, seen := r.output[key]; !seen {
			r.order = append(r.order, key)
		}
		r.output[key] = append(r.output[key], ev.Output)
	case "pass", "skip":
		if ev.Test != "" {
			delete(r.output, key)
			return
		}
		delete(r.running, ev.Package)
		word := "ok   "
		if ev.Action == "skip" {
			word = "skip "
		}
		fmt.Fprintf(r.out, "    %s %s %.1fs\n", word, ev.Package, ev.Elapsed)
		r.forget(ev.Package)
	case "fail", "build-fail":
		r.failed = true
		if ev.Test != "" {
			if !r.verbose {
				for _, o := range r.output[key] {
					fmt.Fprint(r.out, "      "+o)
				}
			}
			delete(r.output, key)
			return
		}
		delete(r.running, ev.Package)
		if !r.verbose {
			// Tests that neither passed nor failed were still running
			// when the package ended: a timeout or a panic, whose dump
			// test2json files under the last test it saw start.
			for _, k := range r.order {
				if k != key && strings.HasPrefix(k, ev.Package+" ") && r.output[k] != nil {
					fmt.Fprintf(r.out, "      --- unfinished: %s\n", strings.TrimPrefix(k, ev.Package+" "))
					for _, o := range dump(r.output[k]) {
						fmt.Fprint(r.out, "      "+o)
					}
				}
			}
			for _, o := range r.output[key] {
				fmt.Fprint(r.out, "      "+o)
			}
		}
		fmt.Fprintf(r.out, "    FAIL  %s %.1fs\n", ev.Package, ev.Elapsed)
		r.forget(ev.Package)
	}
}

// forget drops what is kept of pkg's output.
func (r *report) forget(pkg string) {
	for k := range r.output {
		if strings.HasPrefix(k, pkg+" ") {
			delete(r.output, k)
		}
	}
	r.order = slices.DeleteFunc(r.order, func(k string) bool { return strings.HasPrefix(k, pkg+" ") })
}

// maxDump bounds the lines dump keeps of one unfinished test, maxLog
// those of its log before the goroutine dump (its head and its tail).
const (
	maxDump = 1500
	maxLog  = 300
)

// dump is what is printed of an unfinished test's output: every line
// before the goroutine dump, and of the dump the goroutines whose stacks
// pass through the project's code (github.com/idemkit) or the test
// runner's alarm, which name what was stuck; the runtime's and the
// drivers' idle goroutines are counted, not printed. At most maxDump
// lines, the rest counted; of a log longer than maxLog before the dump,
// its head and its tail.
func dump(lines []string) []string {
	var out []string
	var block []string
	dropped := 0
	flush := func() {
		if len(block) == 0 {
			return
		}
		keep := !strings.HasPrefix(block[0], "goroutine ")
		for _, l := range block {
			if strings.Contains(l, "github.com/idemkit/") || strings.Contains(l, "startAlarm") {
				keep = true
			}
		}
		switch {
		case keep && !strings.HasPrefix(block[0], "goroutine ") && len(block) > maxLog:
			// The test's log before the dump: its end (the panic, the
			// tests still running) is what names the hang.
			out = append(out, block[:maxLog/10]...)
			out = append(out, fmt.Sprintf("(%d lines of the test's log left out)\n", len(block)-maxLog))
			out = append(out, block[len(block)-maxLog+maxLog/10:]...)
		case keep:
			out = append(out, block...)
		default:
			dropped++
		}
		block = block[:0]
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "goroutine ") {
			flush()
		}
		block = append(block, l)
	}
	flush()
	if dropped > 0 {
		out = append(out, fmt.Sprintf("(%d goroutines outside github.com/idemkit left out)\n", dropped))
	}
	if len(out) > maxDump {
		n := len(out) - maxDump
		out = append(out[:maxDump:maxDump], fmt.Sprintf("(%d more lines left out)\n", n))
	}
	return out
}

// tick names the packages still running, every d.
func (r *report) tick(d time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			r.mu.Lock()
			var names []string
			for p, start := range r.running {
				names = append(names, fmt.Sprintf("%s (%s)", p, now.Sub(start).Round(time.Second)))
			}
			slices.Sort(names)
			if len(names) > 0 {
				fmt.Fprintf(r.out, "    ...   still running: %s\n", strings.Join(names, ", "))
			}
			r.mu.Unlock()
		}
	}
}
