package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/sqlstore"
)

const usage = `idemctl: list, show, resolve and release idem's idempotency records

usage:
  idemctl list    [-state indeterminate|in_progress|completed] [-older 5m] [-limit 50] [-after NEXT]
  idemctl show    RECORD_ID
  idemctl resolve RECORD_ID -outcome applied -status 201 [-header 'Name: value']... [-body TEXT | -body-file FILE] -reason TEXT
  idemctl resolve RECORD_ID -outcome not_applied -reason TEXT
  idemctl release RECORD_ID -reason TEXT

every command takes:
  -dsn DSN      the database (default $IDEMCTL_DSN): postgres://..., user:pass@tcp(host:3306)/db, file:idem.db
  -db NAME      postgres, mysql or sqlite, when the DSN does not tell
  -table NAME   the records' table (default idempotency_records)
  -json         JSON output

run "idemctl COMMAND -h" for a command's flags.
`

// errUsage marks a command line that is not understood (exit status 2).
var errUsage = errors.New("usage")

// options are the flags every command takes.
type options struct {
	dsn, db, table string
	json           bool
}

// command is one subcommand: its flags, whether it takes a record id, and
// what it does.
type command struct {
	name   string
	needID bool
	flags  func(fs *flag.FlagSet) func(ctx context.Context, c *ctl) error
}

// ctl is what a command runs with.
type ctl struct {
	store  *sqlstore.Store
	log    *slog.Logger
	id     store.ID
	opts   options
	stdout io.Writer
	now    func() time.Time
}

// engine returns an engine over the store with opts: the operator's only,
// serving no route (so the caller option names nobody), logging its
// actions to standard error.
func (c *ctl) engine(opts ...core.Option) (*core.Engine, error) {
	return core.New(c.store, append([]core.Option{core.WithSingleCaller(), core.WithLogger(c.log)}, opts...)...)
}

var commands = []command{
	{"list", false, listFlags},
	{"show", true, func(*flag.FlagSet) func(context.Context, *ctl) error { return show }},
	{"resolve", true, resolveFlags},
	{"release", true, releaseFlags},
}

// run is the command: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == args[0] {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "idemctl: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	fs := flag.NewFlagSet("idemctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.dsn, "dsn", getenv("IDEMCTL_DSN"), "the database `DSN` (default $IDEMCTL_DSN)")
	fs.StringVar(&o.db, "db", "", "the database: postgres, mysql or sqlite (default: told by the DSN)")
	fs.StringVar(&o.table, "table", sqlstore.DefaultTable, "the records' `table`")
	fs.BoolVar(&o.json, "json", false, "print JSON")
	do := cmd.flags(fs)
	// Flags may come before and after the record id.
	var pos []string
	rest := args[1:]
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	c := &ctl{opts: o, stdout: stdout, now: time.Now,
		log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	switch {
	case cmd.needID && len(pos) != 1:
		fmt.Fprintf(stderr, "idemctl %s: give one RECORD_ID (the record_id of a problem document), got %d arguments\n", cmd.name, len(pos))
		return 2
	case !cmd.needID && len(pos) != 0:
		fmt.Fprintf(stderr, "idemctl %s: unexpected arguments %q\n", cmd.name, pos)
		return 2
	case cmd.needID:
		id, err := store.ParseID(pos[0])
		if err != nil {
			fmt.Fprintf(stderr, "idemctl %s: %v\n", cmd.name, err)
			return 2
		}
		c.id = id
	}
	db, dialect, err := open(o)
	if err != nil {
		fmt.Fprintf(stderr, "idemctl: %v\n", err)
		return 2
	}
	defer db.Close()
	if c.store, err = sqlstore.New(db, dialect, sqlstore.WithTable(o.table)); err != nil {
		fmt.Fprintf(stderr, "idemctl: %v\n", err)
		return 2
	}
	if err := do(ctx, c); err != nil {
		fmt.Fprintf(stderr, "idemctl %s: %v\n", cmd.name, err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

func listFlags(fs *flag.FlagSet) func(context.Context, *ctl) error {
	state := fs.String("state", "indeterminate", "the `state` listed: indeterminate, in_progress or completed")
	older := fs.Duration("older", 0, "list only records at least this `old` (e.g. 5m: leaves running attempts out)")
	limit := fs.Int("limit", 50, "the most records on the page (at most 1000)")
	after := fs.String("after", "", "the `NEXT` of the previous page")
	return func(ctx context.Context, c *ctl) error {
		st, err := store.ParseState(*state)
		if err != nil {
			return fmt.Errorf("%w: -state: %v", errUsage, err)
		}
		if *limit < 1 || *limit > store.MaxListLimit {
			return fmt.Errorf("%w: -limit %d: give 1 to %d", errUsage, *limit, store.MaxListLimit)
		}
		e, err := c.engine()
		if err != nil {
			return err
		}
		page, err := e.Records(ctx, admin.Query{State: st, OlderThan: *older, After: *after, Limit: *limit})
		if err != nil {
			return err
		}
		if c.opts.json {
			if page.Records == nil {
				page.Records = []admin.Record{}
			}
			return c.printJSON(page)
		}
		printList(c.stdout, page, st, *older, c.now())
		if page.Next != "" {
			fmt.Fprintf(c.stdout, "\nmore: idemctl list -state %s%s -limit %d -after %s\n", st, olderFlag(*older), *limit, page.Next)
		}
		return nil
	}
}

func olderFlag(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return " -older " + d.String()
}

func show(ctx context.Context, c *ctl) error {
	e, err := c.engine()
	if err != nil {
		return err
	}
	info, err := e.Record(ctx, c.id)
	if err != nil {
		return err
	}
	if c.opts.json {
		return c.printJSON(info)
	}
	printRecord(c.stdout, info, c.now())
	return nil
}

// headers is the repeatable -header flag.
type headers http.Header

func (h headers) String() string { return "" }

func (h headers) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return fmt.Errorf("want 'Name: value', got %q", v)
	}
	http.Header(h).Add(name, strings.TrimSpace(value))
	return nil
}

func resolveFlags(fs *flag.FlagSet) func(context.Context, *ctl) error {
	outcome := fs.String("outcome", "", "applied (the effect happened: record the answer) or not_applied (nothing happened: release the key)")
	reason := fs.String("reason", "", "why (required; logged with the record id)")
	status := fs.Int("status", 0, "applied: the HTTP `status` every retry gets (200 to 599)")
	body := fs.String("body", "", "applied: the response `body`")
	bodyFile := fs.String("body-file", "", "applied: read the response body from `FILE` (- for standard input)")
	hdr := headers{}
	fs.Var(hdr, "header", "applied: a response header, 'Name: value' (repeatable; default Content-Type: application/json with a body)")
	retention := fs.Duration("retention", core.DefaultRetention, "applied: how long the recorded answer lives")
	return func(ctx context.Context, c *ctl) error {
		if *retention <= 0 {
			return fmt.Errorf("%w: -retention must be positive", errUsage)
		}
		var res core.Resolution
		switch *outcome {
		case "applied":
			b := []byte(*body)
			if *bodyFile != "" {
				if *body != "" {
					return fmt.Errorf("%w: give -body or -body-file, not both", errUsage)
				}
				var err error
				if b, err = readFile(*bodyFile); err != nil {
					return err
				}
			}
			if *status == 0 {
				return fmt.Errorf("%w: -outcome applied needs the -status (and the -body) that every retry is to get", errUsage)
			}
			h := http.Header(hdr)
			if len(b) > 0 && h.Get("Content-Type") == "" {
				h.Set("Content-Type", "application/json")
			}
			res = core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{Status: *status, Header: h, Body: b, BodyKept: true}}
		case "not_applied", "not-applied":
			if *status != 0 || *body != "" || *bodyFile != "" || len(hdr) > 0 {
				return fmt.Errorf("%w: -outcome not_applied releases the key: it records no -status, -body or -header", errUsage)
			}
			res = core.Resolution{Outcome: core.OutcomeNotApplied}
		default:
			return fmt.Errorf("%w: -outcome applied or -outcome not_applied (got %q)", errUsage, *outcome)
		}
		if strings.TrimSpace(*reason) == "" {
			return fmt.Errorf("%w: -reason is required: it is logged with the record id", errUsage)
		}
		e, err := c.engine(core.Retention(*retention))
		if err != nil {
			return err
		}
		info, err := e.ResolveRecord(ctx, c.id, res, *reason)
		if err != nil {
			return err
		}
		if res.Outcome == core.OutcomeNotApplied {
			return c.released("resolved as not applied")
		}
		if c.opts.json {
			return c.printJSON(info)
		}
		fmt.Fprintf(c.stdout, "record %s resolved as applied: every retry with its key now gets %d\n\n", info.ID, info.Status)
		printRecord(c.stdout, info, c.now())
		return nil
	}
}

func releaseFlags(fs *flag.FlagSet) func(context.Context, *ctl) error {
	reason := fs.String("reason", "", "why (required; logged with the record id)")
	return func(ctx context.Context, c *ctl) error {
		if strings.TrimSpace(*reason) == "" {
			return fmt.Errorf("%w: -reason is required: it is logged with the record id", errUsage)
		}
		e, err := c.engine()
		if err != nil {
			return err
		}
		if err := e.ReleaseRecord(ctx, c.id, *reason); err != nil {
			return err
		}
		return c.released("released")
	}
}

// released reports a record that is now absent.
func (c *ctl) released(how string) error {
	if c.opts.json {
		return c.printJSON(map[string]string{"record_id": c.id.String(), "state": "absent"})
	}
	fmt.Fprintf(c.stdout, "record %s %s: the next retry with its key runs the handler\n", c.id, how)
	return nil
}

func (c *ctl) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func readFile(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

// open opens the database of o.
func open(o options) (*sql.DB, sqlstore.Dialect, error) {
	if o.dsn == "" {
		return nil, 0, errors.New("no database: give -dsn or set IDEMCTL_DSN")
	}
	d, driver, dsn, err := parseDSN(o.db, o.dsn)
	if err != nil {
		return nil, 0, err
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, 0, err
	}
	db.SetMaxOpenConns(2)
	return db, d, nil
}
