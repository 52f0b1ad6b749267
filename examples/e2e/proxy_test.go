package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pipe copies both ways between a and b until either side ends, then closes
// both.
func pipe(a, b net.Conn) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { a.Close(); b.Close() }) }
	go func() { _, _ = io.Copy(b, a); closeBoth() }()
	go func() { _, _ = io.Copy(a, b); closeBoth() }()
}

func listenLoopback(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// --- a proxy that loses one response -----------------------------------------

// lossyProxy forwards TCP connections to target. After cutNext, the next
// connection's request is forwarded, the server's whole response is read
// (so the server has committed and answered), and then the client's
// connection is reset without a single byte of that response: the client
// sees a transport error, the server believes it answered. cuts does the
// same to the next cuts connections.
type lossyProxy struct {
	ln      net.Listener
	target  string
	cutNext atomic.Bool
	cuts    atomic.Int32
	lost    chan lostResponse // one per cut connection
}

// lostResponse is what the server sent on a cut connection.
type lostResponse struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func newLossyProxy(t testing.TB, target string) *lossyProxy {
	p := &lossyProxy{ln: listenLoopback(t), target: target, lost: make(chan lostResponse, 16)}
	go p.serve()
	return p
}

func (p *lossyProxy) addr() string { return p.ln.Addr().String() }

func (p *lossyProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !p.cutNext.CompareAndSwap(true, false) && !p.takeCut() {
			pipe(c, s)
			continue
		}
		go p.cut(c, s)
	}
}

// takeCut takes one of p.cuts, if any is left.
func (p *lossyProxy) takeCut() bool {
	for {
		n := p.cuts.Load()
		if n <= 0 {
			return false
		}
		if p.cuts.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

func (p *lossyProxy) cut(c, s net.Conn) {
	go func() { _, _ = io.Copy(s, c) }() // the request goes through
	var lr lostResponse
	resp, err := http.ReadResponse(bufio.NewReader(s), nil)
	if err == nil {
		lr.status, lr.header = resp.StatusCode, resp.Header
		lr.body, err = io.ReadAll(resp.Body)
	}
	lr.err = err
	// Reset the client's connection: no byte of the answer reaches it.
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
	s.Close()
	p.lost <- lr
}

// --- a round-robin balancer ----------------------------------------------------

// balancer spreads TCP connections over backends in turn, skipping a
// backend it cannot connect to (a killed process), and remembers which
// backend served each client connection.
type balancer struct {
	ln       net.Listener
	backends []string
	next     atomic.Uint64

	mu     sync.Mutex
	served map[string]int // client address (as the balancer sees it) -> backend index
	counts []int          // connections per backend
}

func newBalancer(t testing.TB, backends ...string) *balancer {
	b := &balancer{ln: listenLoopback(t), backends: backends, served: map[string]int{}, counts: make([]int, len(backends))}
	go b.serve()
	return b
}

func (b *balancer) addr() string { return b.ln.Addr().String() }

func (b *balancer) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		go b.route(c)
	}
}

func (b *balancer) route(c net.Conn) {
	first := int(b.next.Add(1)-1) % len(b.backends)
	for i := range b.backends {
		idx := (first + i) % len(b.backends)
		s, err := net.DialTimeout("tcp", b.backends[idx], 2*time.Second)
		if err != nil {
			continue
		}
		b.mu.Lock()
		b.served[c.RemoteAddr().String()] = idx
		b.counts[idx]++
		b.mu.Unlock()
		pipe(c, s)
		return
	}
	c.Close()
}

// backendOf is the backend that served the client connection whose local
// address is clientAddr, or -1.
func (b *balancer) backendOf(clientAddr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i, ok := b.served[clientAddr]; ok {
		return i
	}
	return -1
}

func (b *balancer) connCounts() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.counts...)
}
