package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite" // database/sql driver "sqlite", the one the service links
	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/idemkit/idem/examples/benchrig"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// binary is the orders service, built once by TestMain, otelBinary the
// OpenTelemetry example (examples/otel); idemctl the operator's command.
var binary, otelBinary, idemctl string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	// The tests mostly wait for service processes and timers (work delays,
	// leases), not for the CPU: unless -parallel was given, run all of them
	// at once instead of GOMAXPROCS at a time.
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", "16")
	}
	dir, err := os.MkdirTemp("", "idem-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	start := time.Now()
	binary, otelBinary = filepath.Join(dir, "orders"), filepath.Join(dir, "otel")
	for bin, pkg := range map[string]string{binary: "orders", otelBinary: "otel"} {
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "github.com/idemkit/idem/examples/"+pkg)
		cmd := exec.Command(goTool, args...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: go %s: %v\n", strings.Join(args, " "), err)
			return 1
		}
	}
	// idemctl, the operator's command, from its own module (the e2e
	// tests run it against the service's database).
	idemctl = filepath.Join(dir, "idemctl")
	cmd := exec.Command(goTool, "build", "-o", idemctl, ".")
	cmd.Dir = filepath.Join("..", "..", "idemctl")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build idemctl: %v\n", err)
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: built %s, %s (race=%v) and idemctl in %s\n", binary, otelBinary, raceEnabled, time.Since(start).Round(time.Millisecond))
	}
	return m.Run()
}

// --- service processes -------------------------------------------------------

// config is how one service process is started.
type config struct {
	otel      bool   // the OpenTelemetry example (examples/otel: -addr and extra only), not the orders service
	framework string // gin, echo, chi
	store     string // gorm, sql
	db        *database
	dsn       string   // the service's -dsn, when not db.serviceDSN (a Galera node's)
	extra     []string // more flags: -work-delay, -lease, ...
}

func (c config) String() string {
	if c.otel {
		return "otel"
	}
	return c.db.kind + "/" + c.framework + "/" + c.store
}

// server is one running service process.
type server struct {
	name string
	cmd  *exec.Cmd
	addr string // host:port it listens on
	logs *logBuffer
	out  *outBuffer // standard output (-otel stdout writes there)

	addrc   chan string   // the address from the "listening" line
	done    chan struct{} // closed when the process has exited
	waitErr error
}

// logBuffer keeps a process's output, line by line.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBuffer) add(line string) {
	b.mu.Lock()
	b.lines = append(b.lines, line)
	b.mu.Unlock()
}

func (b *logBuffer) snapshot() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.lines...)
}

func (b *logBuffer) String() string { return strings.Join(b.snapshot(), "\n") }

// outBuffer keeps a process's standard output (written by exec's copying
// goroutine while the test reads it).
type outBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *outBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *outBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// grep returns the lines that match re.
func (b *logBuffer) grep(re *regexp.Regexp) []string {
	var out []string
	for _, l := range b.snapshot() {
		if re.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

var listeningRE = regexp.MustCompile(`msg="(?:orders|otel): listening" addr=(\S+)`)

// startServer starts the service with c on 127.0.0.1:0 and waits for its
// "listening" log line. The process is killed at the end of the test if it
// is still running; its log is printed when the test failed, and a data race
// it reports fails the test.
func startServer(t testing.TB, name string, c config) *server {
	t.Helper()
	return startServerFor(t, t, name, c)
}

// startServerFor is startServer for a process that outlives the (sub)test t
// that starts it: owner's cleanup ends it.
func startServerFor(t, owner testing.TB, name string, c config) *server {
	t.Helper()
	s := launch(t, owner, name, c)
	s.waitReady(t)
	return s
}

// launch starts the process without waiting for it to listen (see
// waitReady), so that several can start at the same moment.
func launch(t, owner testing.TB, name string, c config) *server {
	t.Helper()
	bin, args := otelBinary, []string{"-addr", "127.0.0.1:0"}
	if !c.otel {
		dsn := c.dsn
		if dsn == "" {
			dsn = c.db.serviceDSN
		}
		bin, args = binary, append(args, "-framework", c.framework, "-store", c.store, "-db", c.db.kind, "-dsn", dsn)
	}
	args = append(args, c.extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=0 exitcode=66")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &server{name: name, cmd: cmd, logs: &logBuffer{}, out: &outBuffer{}, done: make(chan struct{}), addrc: make(chan string, 1)}
	cmd.Stdout = s.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: start: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			s.logs.add(line)
			if m := listeningRE.FindStringSubmatch(line); m != nil {
				select {
				case s.addrc <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	owner.Cleanup(func() {
		if owner.Failed() {
			s.dumpGoroutines()
		}
		s.kill()
		if raced := s.logs.grep(regexp.MustCompile(`WARNING: DATA RACE`)); len(raced) > 0 {
			owner.Errorf("%s reported a data race", name)
		}
		if owner.Failed() {
			owner.Logf("--- log of %s (%s)\n%s", name, strings.Join(args, " "), s.logs)
		} else if warned := s.logs.grep(regexp.MustCompile(`level=(WARN|ERROR)`)); len(warned) > 0 {
			owner.Logf("%s logged warnings:\n%s", name, strings.Join(warned, "\n"))
		}
	})
	return s
}

// waitReady waits for the process's "listening" line and sets s.addr.
func (s *server) waitReady(t testing.TB) {
	t.Helper()
	if err := s.ready(60 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// ready is waitReady returning the failure.
func (s *server) ready(bound time.Duration) error {
	select {
	case s.addr = <-s.addrc:
		return nil
	case <-s.done:
		return fmt.Errorf("%s exited before listening: %v\n%s", s.name, s.waitErr, s.logs)
	case <-time.After(bound):
		return fmt.Errorf("%s: no listening line after %s\n%s", s.name, bound, s.logs)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (s *server) kill() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

// dumpGoroutines sends SIGQUIT, so a process still running prints its
// goroutines into its log before it exits (for the failure report).
func (s *server) dumpGoroutines() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
}

// terminate sends SIGTERM and returns the exit code (or fails the test after
// 30 s).
func (s *server) terminate(t testing.TB) int {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: still running 30s after SIGTERM", s.name)
	}
	return s.cmd.ProcessState.ExitCode()
}

// --- databases ---------------------------------------------------------------

// database is a fresh database for one test: the DSN the service is started
// with, and the test's own connection to look at its tables.
type database struct {
	kind       string // sqlite, postgres, mysql (the service's -db)
	serviceDSN string
	db         *sql.DB
	// nodeDSNs: on a Galera cluster, the database on each node (the
	// first is serviceDSN), and a pool on each of the others.
	nodeDSNs []string
	nodeDBs  []*sql.DB
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newDatabase creates an empty database of kind: a file in t.TempDir() for
// SQLite, a new database (dropped at the end) on the Postgres or MariaDB
// server named by the environment.
func newDatabase(t testing.TB, kind string) *database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "idem_e2e_" + randomHex(6)
	d := &database{kind: kind}
	switch kind {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "orders.db")
		d.serviceDSN = path
		db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
		if err != nil {
			t.Fatal(err)
		}
		d.db = db
		t.Cleanup(func() { db.Close() })
	case "postgres":
		admin := sqlstoretest.DSN(t, sqlstoretest.EnvPostgres)
		adb := openDB(t, "pgx", admin)
		if _, err := adb.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			t.Fatalf("postgres: CREATE DATABASE %s: %v", name, err)
		}
		u, err := url.Parse(admin)
		if err != nil {
			t.Fatalf("%s: %v", sqlstoretest.EnvPostgres, err)
		}
		u.Path = "/" + name
		d.serviceDSN = u.String()
		d.db = openDB(t, "pgx", d.serviceDSN)
		t.Cleanup(func() {
			d.db.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := adb.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
				t.Errorf("postgres: DROP DATABASE %s: %v", name, err)
			}
			adb.Close()
		})
	case "mysql":
		admin := sqlstoretest.DSN(t, sqlstoretest.EnvMySQL)
		cfg, err := mysql.ParseDSN(admin)
		if err != nil {
			t.Fatalf("%s: %v", sqlstoretest.EnvMySQL, err)
		}
		cfg.ParseTime = true
		adb := openDB(t, "mysql", cfg.FormatDSN())
		if _, err := adb.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			t.Fatalf("mysql: CREATE DATABASE %s: %v", name, err)
		}
		cfg.DBName = name
		d.serviceDSN = cfg.FormatDSN()
		d.db = openDB(t, "mysql", d.serviceDSN)
		t.Cleanup(func() {
			d.db.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := adb.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
				t.Errorf("mysql: DROP DATABASE %s: %v", name, err)
			}
			adb.Close()
		})
	default:
		t.Fatalf("unknown database %q", kind)
	}
	return d
}

func openDB(t testing.TB, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("%s: %v", driver, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		t.Fatalf("%s: %v", driver, err)
	}
	return db
}

// count runs a SELECT COUNT(*) on the database.
func (d *database) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	query = benchrig.Rebind(d.kind, query)
	var n int
	if err := d.db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %s: %v", d.kind, query, err)
	}
	return n
}

// writerBusy reports whether a SQLite write transaction is open on the
// database (another writer holds the lock): SQLite cannot tell a duplicate
// "in progress" (see sqlstore's README), so the tests look at the lock
// itself to know that a request is inside its transaction.
func (d *database) writerBusy(t testing.TB) bool {
	t.Helper()
	db, err := sql.Open("sqlite", d.serviceDSN+"?_pragma=busy_timeout(0)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		if strings.Contains(err.Error(), "SQLITE_BUSY") || strings.Contains(err.Error(), "locked") {
			return true
		}
		t.Fatalf("sqlite: BEGIN IMMEDIATE: %v", err)
	}
	_ = tx.Rollback()
	return false
}

// inTransaction reports whether the service holds a transaction open on the
// database right now (a request is inside its atomic transaction): an open
// write transaction for SQLite, a session idle in transaction for Postgres,
// an InnoDB transaction of another session for MariaDB.
func (d *database) inTransaction(t testing.TB) bool {
	t.Helper()
	switch d.kind {
	case "sqlite":
		return d.writerBusy(t)
	case "postgres":
		return d.count(t, `SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()
			AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'`) > 0
	default:
		// information_schema.innodb_trx is no use here: MariaDB refreshes
		// it only when nobody read it for 100 ms, so polling it (from any
		// session on the server) can freeze it. A locking read that must
		// not wait runs into the implicit lock of the request's
		// uncommitted order instead. On Galera, locks are local to a
		// node: ask every node.
		for _, db := range d.nodeDBs {
			if ordersLocked(t, db) {
				return true
			}
		}
		return ordersLocked(t, d.db)
	}
}

// ordersLocked reports whether a MariaDB transaction of another session on
// db's server holds a row of orders.
func ordersLocked(t testing.TB, db *sql.DB) bool {
	t.Helper()
	{
		tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			t.Fatalf("mysql: begin: %v", err)
		}
		defer tx.Rollback()
		rows, err := tx.Query(`SELECT id FROM orders FOR UPDATE NOWAIT`)
		if err == nil {
			for rows.Next() {
			}
			err = rows.Err()
			rows.Close()
		}
		var me *mysql.MySQLError
		if errors.As(err, &me) && (me.Number == 1205 || me.Number == 3572) { // lock wait timeout / NOWAIT
			return true
		}
		if err != nil {
			t.Fatalf("mysql: locking read: %v", err)
		}
		return false
	}
}

// diagnose logs what the database's sessions are doing (on a failure).
func (d *database) diagnose(t testing.TB) {
	t.Helper()
	var q string
	switch d.kind {
	case "postgres":
		q = `SELECT pid::text, COALESCE(state, ''), COALESCE(wait_event_type, '') || ':' || COALESCE(wait_event, ''), LEFT(query, 200)
			FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`
	case "mysql":
		q = `SELECT CAST(p.id AS CHAR), CONCAT(p.command, ' ', COALESCE(p.state, ''), ' ', p.time, 's'),
			COALESCE(CONCAT(t.trx_state, ' since ', t.trx_started), 'no trx'), LEFT(COALESCE(p.info, ''), 200)
			FROM information_schema.processlist p LEFT JOIN information_schema.innodb_trx t ON t.trx_mysql_thread_id = p.id
			WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()`
	default:
		return
	}
	rows, err := d.db.Query(q)
	if err != nil {
		t.Logf("diagnose: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var a, b, c, e string
		if err := rows.Scan(&a, &b, &c, &e); err != nil {
			t.Logf("diagnose: %v", err)
			return
		}
		t.Logf("session %s | %s | %s | %s", a, b, c, e)
	}
}

// waitInTransaction waits until a request is inside its transaction.
func (d *database) waitInTransaction(t testing.TB, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !d.inTransaction(t) {
		if time.Now().After(deadline) {
			d.diagnose(t)
			t.Fatalf("no request inside its transaction after %s", bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor polls cond every 20 ms for at most bound.
func waitFor(t testing.TB, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// --- HTTP --------------------------------------------------------------------

// answer is one HTTP response, read to the end.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) String() string {
	return fmt.Sprintf("%d %q (Replayed=%q Retry-After=%q)", a.status, a.body, a.header.Get("Idempotent-Replayed"), a.header.Get("Retry-After"))
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// client is shared by the tests; every test uses a fresh connection when it
// matters (see newClient).
var client = newClient(false)

// newClient returns an HTTP client; fresh opens a new TCP connection for
// every request (so a balancer sees each request).
func newClient(fresh bool) *http.Client {
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives:   fresh,
			MaxIdleConnsPerHost: 64,
			Proxy:               nil,
		},
	}
}

// do sends one request. body "" sends no body. It returns the transport's
// error, if any, without failing the test.
func do(ctx context.Context, c *http.Client, method, u, account, key, body string) (answer, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return answer{}, err
	}
	if account != "" {
		req.Header.Set("Authorization", "Bearer "+account)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// mustDo is do that fails the test on a transport error.
func mustDo(t testing.TB, c *http.Client, method, u, account, key, body string) answer {
	t.Helper()
	a, err := do(context.Background(), c, method, u, account, key, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	return a
}

// retryAfter is a 409's Retry-After, bounded to [100ms, 5s].
func retryAfter(a answer) time.Duration {
	d := time.Second
	if s, err := strconv.Atoi(a.header.Get("Retry-After")); err == nil {
		d = time.Duration(s) * time.Second
	}
	return min(max(d, 100*time.Millisecond), 5*time.Second)
}

// retryUntilSettled repeats the request while the answer is a 409 (waiting
// the Retry-After the server gives each time) or a transport error, for at
// most bound.
func retryUntilSettled(t testing.TB, c *http.Client, method, u, account, key, body string, bound time.Duration) (answer, int) {
	t.Helper()
	deadline := time.Now().Add(bound)
	tries := 0
	for {
		tries++
		a, err := do(context.Background(), c, method, u, account, key, body)
		if err == nil && a.status != http.StatusConflict {
			return a, tries
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("%s %s: still failing after %s (%d tries): %v", method, u, bound, tries, err)
			}
			t.Fatalf("%s %s: still 409 after %s (%d tries): %v", method, u, bound, tries, a)
		}
		wait := 200 * time.Millisecond
		if err == nil {
			wait = retryAfter(a)
		}
		time.Sleep(wait)
	}
}

// orders is GET /orders for account, decoded.
type order struct {
	ID        int64  `json:"id"`
	Account   string `json:"account"`
	Item      string `json:"item"`
	Quantity  int    `json:"quantity"`
	CreatedAt string `json:"created_at"`
}

// listOrders is GET /orders for account.
func listOrders(t testing.TB, base, account string) []order {
	t.Helper()
	a := mustDo(t, client, http.MethodGet, base+"/orders", account, "", "")
	if a.status != http.StatusOK {
		t.Fatalf("GET /orders as %s: %v", account, a)
	}
	var out []order
	if err := json.Unmarshal(a.body, &out); err != nil {
		t.Fatalf("GET /orders as %s: %v: %s", account, err, a.body)
	}
	return out
}

// decodeOrder decodes a 201 body of POST /orders.
func decodeOrder(t testing.TB, b []byte) order {
	t.Helper()
	var o order
	if err := json.Unmarshal(b, &o); err != nil || o.ID == 0 {
		t.Fatalf("not an order: %q (%v)", b, err)
	}
	return o
}

func orderBody(item string, qty int) string {
	return fmt.Sprintf(`{"item":%q,"quantity":%d}`, item, qty)
}
