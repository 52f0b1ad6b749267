// Command delayproxy forwards TCP connections to a server (Postgres,
// MariaDB) and delays every byte by a fixed one-way delay in each
// direction, so that a benchmark on loopback sees the round trips of a
// database one network hop away (scripts/bench-e2e.sh -delay). Bytes keep
// their order and are never held longer than the delay: each chunk read
// is written out once its arrival time plus the delay has passed.
//
//	delayproxy -listen 127.0.0.1:PORT -target 127.0.0.1:5432 -delay 250us
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"runtime"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	target := flag.String("target", "", "address to forward to (required)")
	delay := flag.Duration("delay", 250*time.Microsecond, "one-way delay added in each direction")
	flag.Parse()
	if *target == "" {
		log.Fatal("delayproxy: -target is required")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("delayproxy: %s -> %s, %v each way", ln.Addr(), *target, *delay)
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go serve(c, *target, *delay)
	}
}

// serve forwards one client connection to target, both directions
// delayed.
func serve(client net.Conn, target string, delay time.Duration) {
	server, err := net.Dial("tcp", target)
	if err != nil {
		log.Printf("delayproxy: dial %s: %v", target, err)
		_ = client.Close()
		return
	}
	for _, c := range []net.Conn{client, server} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
	}
	go pipe(server, client, delay)
	pipe(client, server, delay)
}

// chunk is what one read returned, and when.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst, each chunk written delay after it was read. It
// closes both connections when either side ends.
func pipe(dst, src net.Conn, delay time.Duration) {
	defer dst.Close()
	defer src.Close()
	queue := make(chan chunk, 1024)
	go func() {
		defer close(queue)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				queue <- chunk{b[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range queue {
		waitUntil(c.at.Add(delay))
		if _, err := dst.Write(c.b); err != nil {
			// Drain so the reader is not stuck on a full queue.
			go func() {
				for range queue {
				}
			}()
			_, _ = io.Copy(io.Discard, src)
			return
		}
	}
}

// timerSlack is how late a timer may fire: about a millisecond on the
// virtual machines these benchmarks ran on, four times the 250 µs delay
// (a plain time.Sleep made a 0.5 ms round trip 2.4 ms).
const timerSlack = 1500 * time.Microsecond

// waitUntil returns at t: it sleeps while t is further than timerSlack,
// then yields in a loop until t (exact, at the cost of the CPU the loop
// takes from the service and the database; use few connections).
//
// A version that waited with the kernel's nanosleep instead (2026-12-01)
// took a quarter of the CPU and was as fast behind an echo server, but it
// made the example service's latency on one connection bimodal: p50 4.7
// ms in some rounds and 14-15 ms in others, for the same route, where
// this loop's stayed within 5.4-6.4 ms. The virtual machine is slow to
// wake an idle CPU, and the loop keeps one awake.
func waitUntil(t time.Time) {
	if d := time.Until(t); d > timerSlack {
		time.Sleep(d - timerSlack)
	}
	for time.Now().Before(t) {
		runtime.Gosched()
	}
}
