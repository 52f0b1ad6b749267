#!/usr/bin/env bash
# The project's test command: run `scripts/test.sh` from anywhere.
#
#   scripts/test.sh [go test flags...]     e.g. scripts/test.sh -run Foo -v
#
# 1. gofmt check of every tracked and untracked (non-ignored) .go file.
# 2. Starts a throwaway PostgreSQL + MariaDB (scripts/dbs.sh) on loopback,
#    unless IDEM_TEST_POSTGRES_DSN and IDEM_TEST_MYSQL_DSN are both already
#    set, or IDEM_TEST_SKIP_DB_START=1, and a three-node MariaDB Galera
#    cluster (about 30 s) unless IDEM_TEST_GALERA_DSNS is set or
#    IDEM_TEST_SKIP_DB_START=1, and the Redis servers (one server, a
#    three-primary cluster, a Sentinel group; a few seconds) unless
#    IDEM_TEST_REDIS_ADDR is set or IDEM_TEST_SKIP_DB_START=1; a missing
#    package is installed with apt-get. They are stopped again on exit.
# 3. For every module of the workspace (go list -m): go vet ./... and
#    go test -race -count=1 [flags] ./..., with -json through
#    internal/testfmt: a line as each package starts and ends, with its
#    time, what failed (a package that timed out: the tests that never
#    ended and their goroutines in the project's code), and every minute
#    the packages still running; a
#    line as each module ends, with its time.
# 4. The release rehearsal (scripts/release.sh --rehearse, about a minute):
#    the release made in a throwaway copy at a version no one sees, a
#    file:// module proxy from its tags, every module vetted on its own
#    (GOWORK=off) against it, and each published module got through it by a
#    scratch module outside the repository, with no replace line, and the
#    README's quick starts built (docs/releasing.md).
# 5. Prints a per-module PASS/FAIL summary; exits non-zero if anything failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd -P)

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

say() { printf '\n=== %s\n' "$*"; }

# --------------------------------------------------------------------------
# gofmt

say "gofmt"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	mapfile -d '' gofiles < <(git -C "$root" ls-files -z --cached --others --exclude-standard -- '*.go')
else
	mapfile -d '' gofiles < <(find . -name '*.go' -not -path './.git/*' -print0)
fi
existing=()
for f in "${gofiles[@]+"${gofiles[@]}"}"; do
	[[ -f "$f" ]] && existing+=("$f")
done
unformatted=""
if ((${#existing[@]} > 0)); then
	unformatted=$(printf '%s\0' "${existing[@]}" | xargs -0 gofmt -l)
fi
if [[ -n "$unformatted" ]]; then
	echo "gofmt: these files are not gofmt-formatted (run gofmt -w on them):"
	printf '%s\n' "$unformatted" | sed 's/^/  /'
	exit 1
fi
echo "gofmt: ok (${#existing[@]} files)"

# --------------------------------------------------------------------------
# the workspace's modules (with go.work present, every module it uses)

if ! modlist=$(go list -m -f '{{.Dir}}'); then
	echo "test.sh: go list -m failed" >&2
	exit 1
fi
mapfile -t modules <<<"$modlist"
if [[ -z "$modlist" ]] || ((${#modules[@]} == 0)); then
	echo "test.sh: go list -m found no modules" >&2
	exit 1
fi
echo "modules: ${#modules[@]}"

# --------------------------------------------------------------------------
# databases

dbdir=""
step_pid=""
cleanup() {
	local rc=$?
	if [[ -n "$step_pid" ]]; then
		kill -TERM -- "-$step_pid" 2>/dev/null || true
	fi
	if [[ -n "$dbdir" ]]; then
		bash "$root/scripts/dbs.sh" stop "$dbdir" || true
		rm -rf "$dbdir"
	fi
	exit "$rc"
}
# on_signal SIG CODE: pass the signal on to the running step, then exit.
on_signal() {
	if [[ -n "$step_pid" ]]; then
		kill "-$1" -- "-$step_pid" 2>/dev/null || true
		sleep 1
	fi
	exit "$2"
}
trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM

# run_step DIR CMD...: run CMD in DIR in its own process group and wait for
# it, so that a signal to this script is acted on at once (bash defers traps
# while a foreground child runs) and can be passed on to the whole step.
run_step() {
	local dir=$1 rc=0
	shift
	(cd "$dir" && exec setsid "$@") &
	step_pid=$!
	wait "$step_pid" || rc=$?
	step_pid=""
	return "$rc"
}

if [[ -n "${IDEM_TEST_POSTGRES_DSN:-}" && -n "${IDEM_TEST_MYSQL_DSN:-}" ]]; then
	say "databases: using IDEM_TEST_POSTGRES_DSN and IDEM_TEST_MYSQL_DSN from the environment"
elif [[ "${IDEM_TEST_SKIP_DB_START:-}" == 1 ]]; then
	say "databases: IDEM_TEST_SKIP_DB_START=1, not starting any"
else
	say "databases: starting PostgreSQL and MariaDB"
	dbdir=$(mktemp -d /tmp/idem-test-db.XXXXXX)
	bash "$root/scripts/dbs.sh" start "$dbdir"
	# shellcheck disable=SC1091
	source "$dbdir/env"
	if [[ -z "${IDEM_TEST_POSTGRES_DSN:-}" || -z "${IDEM_TEST_MYSQL_DSN:-}" ]]; then
		echo "test.sh: $dbdir/env did not set both DSNs" >&2
		exit 1
	fi
fi

# The Galera cluster (three MariaDB nodes): started with the servers above,
# or on its own when the single servers came from the environment.
if [[ -n "${IDEM_TEST_GALERA_DSNS:-}" ]]; then
	:
elif [[ "${IDEM_TEST_SKIP_DB_START:-}" == 1 ]]; then
	echo "note: IDEM_TEST_GALERA_DSNS is not set and IDEM_TEST_SKIP_DB_START=1"
else
	say "databases: starting a three-node MariaDB Galera cluster"
	if [[ -z "$dbdir" ]]; then
		dbdir=$(mktemp -d /tmp/idem-test-db.XXXXXX)
	fi
	bash "$root/scripts/dbs.sh" start-galera "$dbdir"
	# shellcheck disable=SC1091
	source "$dbdir/env"
	if [[ -z "${IDEM_TEST_GALERA_DSNS:-}" ]]; then
		echo "test.sh: $dbdir/env did not set IDEM_TEST_GALERA_DSNS" >&2
		exit 1
	fi
fi
if [[ -n "${IDEM_TEST_GALERA_DSNS:-}" ]]; then
	export IDEM_TEST_GALERA_DSNS
	echo "IDEM_TEST_GALERA_DSNS=$IDEM_TEST_GALERA_DSNS"
fi

# Redis (redisstore's tests): started with the servers above, or on its
# own when they came from the environment.
if [[ -n "${IDEM_TEST_REDIS_ADDR:-}" ]]; then
	:
elif [[ "${IDEM_TEST_SKIP_DB_START:-}" == 1 ]]; then
	echo "note: IDEM_TEST_REDIS_ADDR is not set and IDEM_TEST_SKIP_DB_START=1"
else
	say "databases: starting Redis (a server, a three-primary cluster, a Sentinel group)"
	if [[ -z "$dbdir" ]]; then
		dbdir=$(mktemp -d /tmp/idem-test-db.XXXXXX)
	fi
	bash "$root/scripts/dbs.sh" start-redis "$dbdir"
	# shellcheck disable=SC1091
	source "$dbdir/env"
	if [[ -z "${IDEM_TEST_REDIS_ADDR:-}" ]]; then
		echo "test.sh: $dbdir/env did not set IDEM_TEST_REDIS_ADDR" >&2
		exit 1
	fi
fi
if [[ -n "${IDEM_TEST_REDIS_ADDR:-}" ]]; then
	export IDEM_TEST_REDIS_ADDR IDEM_TEST_REDIS_CLUSTER_ADDRS IDEM_TEST_REDIS_SENTINEL_ADDRS IDEM_TEST_REDIS_SENTINEL_MASTER
	echo "IDEM_TEST_REDIS_ADDR=$IDEM_TEST_REDIS_ADDR"
	echo "IDEM_TEST_REDIS_CLUSTER_ADDRS=${IDEM_TEST_REDIS_CLUSTER_ADDRS:-}"
	echo "IDEM_TEST_REDIS_SENTINEL_ADDRS=${IDEM_TEST_REDIS_SENTINEL_ADDRS:-}"
fi

if [[ -n "${IDEM_TEST_POSTGRES_DSN:-}" && -n "${IDEM_TEST_MYSQL_DSN:-}" ]]; then
	# Database tests must fail, not skip, when a DSN is missing.
	export IDEM_REQUIRE_DB=1
	export IDEM_TEST_POSTGRES_DSN IDEM_TEST_MYSQL_DSN
	echo "IDEM_TEST_POSTGRES_DSN=$IDEM_TEST_POSTGRES_DSN"
	echo "IDEM_TEST_MYSQL_DSN=$IDEM_TEST_MYSQL_DSN"
else
	echo "note: no database DSNs; database tests will be skipped (IDEM_REQUIRE_DB=${IDEM_REQUIRE_DB:-unset})"
fi

# --------------------------------------------------------------------------
# modules

# go test's progress: -json through internal/testfmt, which prints a line
# as each package starts and ends (with its time), the output of what
# failed, and every minute the packages still running (with -v, all
# output). The step's status stays go test's (pipefail).
testfmt="${TMPDIR:-/tmp}/idem-testfmt-$$"
go build -o "$testfmt" ./internal/testfmt
fmtflags=()
for a in "$@"; do
	case $a in -v | -v=true | -test.v | -test.v=true) fmtflags=(-v) ;; esac
done

summary=()
failed=0
for dir in "${modules[@]}"; do
	rel=${dir#"$root"}
	rel=${rel#/}
	rel=${rel:-.}
	problems=()
	t0=$(date +%s)

	# go vet/test fail on "./..." matching nothing: a module without packages
	# (yet) has nothing to check.
	if pkgs=$(cd "$dir" && go list ./... 2>/dev/null) && [[ -z "$pkgs" ]]; then
		say "$rel: no packages, nothing to check"
		summary+=("$(printf 'PASS  %-16s %4ss  (no packages)' "$rel" 0)")
		continue
	fi

	say "$rel: go vet ./..."
	run_step "$dir" go vet ./... || problems+=("go vet")

	say "$rel: go test -race -count=1 $* ./..."
	run_step "$dir" bash -o pipefail -c 'f=$1; shift; go test -json -race -count=1 "$@" ./... | "$f" '"${fmtflags[*]:-}" \
		_ "$testfmt" "$@" || problems+=("go test")

	secs=$(($(date +%s) - t0))
	if ((${#problems[@]} == 0)); then
		echo "=== $rel: PASS in ${secs}s"
		summary+=("$(printf 'PASS  %-16s %4ss' "$rel" "$secs")")
	else
		failed=$((failed + 1))
		joined=$(printf '%s, ' "${problems[@]}")
		echo "=== $rel: FAIL in ${secs}s (${joined%, })"
		summary+=("$(printf 'FAIL  %-16s %4ss  failed: %s' "$rel" "$secs" "${joined%, }")")
	fi
done

rm -f "$testfmt"

# --------------------------------------------------------------------------
# the release rehearsal: each module on its own, and as a user gets it

say "release rehearsal: a module proxy from throwaway tags; each module on its own; each published one got from outside (scripts/release.sh --rehearse)"
t0=$(date +%s)
rehearsal=0
run_step "$root" bash "$root/scripts/release.sh" --rehearse || rehearsal=1
secs=$(($(date +%s) - t0))
if ((rehearsal == 0)); then
	summary+=("$(printf 'PASS  %-16s %4ss  (release rehearsal passed)' "release" "$secs")")
else
	summary+=("$(printf 'FAIL  %-16s %4ss  failed: scripts/release.sh --rehearse' "release" "$secs")")
fi

say "summary"
printf '%s\n' "${summary[@]}"
if ((failed > 0 || rehearsal != 0)); then
	echo "test.sh: FAIL ($failed of ${#modules[@]} modules failed$( ((rehearsal == 0)) || echo '; the release rehearsal failed'))"
	exit 1
fi
echo "test.sh: PASS (all ${#modules[@]} modules, and the release rehearsal)"
