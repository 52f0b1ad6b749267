#!/usr/bin/env bash
# Where a protected request's cost goes, end to end: runs the example
# service (examples/orders, benchmark mode) on Postgres and, for each of
# the protected and the unprotected route in turn, drives it with wrk
# while taking
#   - a Go CPU profile of the service (its hidden -pprof-addr),
#   - the CPU time (user + system) of the service, of every process of the
#     Postgres server, and of wrk, from /proc, per request,
#   - pg_stat_statements (calls, mean time, rows, WAL bytes and records,
#     shared blocks dirtied per call) when the server has it loaded
#     (shared_preload_libraries = 'pg_stat_statements'; the script creates
#     the extension).
#
#   scripts/profile-e2e.sh [-store pgx|sql|gorm] [-route settle|orders] [-duration 15s] [-conns 8]
#       [-pg-pid PID (the postmaster, for its CPU; default: read from the DSN's server)] [-out DIR]
#       [-bin path/to/orders (default: built from examples/orders)] [-rounds N (default 1)]
#
# Needs IDEM_TEST_POSTGRES_DSN (a superuser: it creates and drops a
# database idem_prof_<pid>). Writes DIR/<kind>.pprof, DIR/<kind>.top (the
# profile's top functions, flat and cumulative), DIR/<kind>.stmts and
# prints the per-request CPU split.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd -P)

store=pgx
route=settle
duration=15s
conns=8
pg_pid=""
out=""
bin=""
rounds=1
while (($#)); do
	case "$1" in
	-store) store=$2; shift 2 ;;
	-route) route=$2; shift 2 ;;
	-duration) duration=$2; shift 2 ;;
	-conns) conns=$2; shift 2 ;;
	-pg-pid) pg_pid=$2; shift 2 ;;
	-out) out=$2; shift 2 ;;
	-bin) bin=$2; shift 2 ;;
	-rounds) rounds=$2; shift 2 ;;
	*) echo "profile-e2e.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
out=${out:-$(mktemp -d /tmp/idem-e2e-profile.XXXXXX)}
mkdir -p "$out"
admin=${IDEM_TEST_POSTGRES_DSN:?set IDEM_TEST_POSTGRES_DSN}
secs=${duration%s}

if [[ -z $bin ]]; then
	bin="$out/orders"
	(cd examples && go build -o "$bin" ./orders)
fi

freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

db="idem_prof_$$"
pid=""
cleanup() {
	[[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
}
trap cleanup EXIT
psql -q "$admin" -c "CREATE DATABASE $db" >/dev/null
base=${admin%%\?*} query=""
[[ $admin == *\?* ]] && query="?${admin#*\?}"
dsn="${base%/*}/$db$query"
pss=0
if psql -qtA "$dsn" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null 2>&1 &&
	psql -qtA "$dsn" -c "SELECT pg_stat_statements_reset()" >/dev/null 2>&1; then
	pss=1
fi
if [[ -z $pg_pid ]]; then
	pg_pid=$(psql -qtA "$dsn" -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'" | xargs -r ps -o ppid= -p | tr -d ' ')
fi

# cpu PIDS...: user + system clock ticks of the processes.
cpu() {
	local t=0 p v
	for p in "$@"; do
		v=$(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null) || v=0 # a backend may exit meanwhile
		t=$((t + ${v:-0}))
	done
	echo "$t"
}
# pgcpu: ticks of the postmaster and its children (backends, walwriter,
# checkpointer, autovacuum), the children that ended included (cutime).
pgcpu() { awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pg_pid/stat" | { read -r own; echo $((own + $(cpu $(pgrep -P "$pg_pid")))); }; }
hz=$(getconf CLK_TCK)

port=$(freeport) pport=$(freeport)
"$bin" -addr "127.0.0.1:$port" -framework gin -store "$store" -db postgres -dsn "$dsn" -unprotected-route -pprof-addr "127.0.0.1:$pport" 2>"$out/server.log" &
pid=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done

wrkrun() { IDEM_PATH=$1 wrk -t2 -c"$conns" -d"$2" --latency -s "$root/scripts/e2e/fresh.lua" "http://127.0.0.1:$port"; }
for path in /$route /$route-unprotected; do wrkrun "$path" 3s >/dev/null; done

echo "store=$store route=$route duration=$duration conns=$conns load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %9s %12s %12s %12s %12s\n' kind req/s "service µs" "postgres µs" "wrk µs" "total µs"
for ((round = 1; round <= rounds; round++)); do
for kind in protected unprotected; do
	path=/$route
	[[ $kind == unprotected ]] && path=/$route-unprotected
	((pss)) && psql -qtA "$dsn" -c "SELECT pg_stat_statements_reset()" >/dev/null
	s0=$(cpu "$pid") p0=$(pgcpu)
	curl -s -o "$out/$kind.pprof" "http://127.0.0.1:$pport/debug/pprof/profile?seconds=$((secs - 1))" &
	cpid=$!
	IDEM_PATH=$path wrk -t2 -c"$conns" -d"$duration" --latency -s "$root/scripts/e2e/fresh.lua" "http://127.0.0.1:$port" >"$out/$kind.wrk" &
	wpid=$!
	w=0
	# wrk's CPU: its last reading while it runs (its /proc entry goes with it).
	while kill -0 "$wpid" 2>/dev/null; do
		v=$(cpu "$wpid" 2>/dev/null || echo 0)
		((v > 0)) && w=$v
		sleep 0.2
	done
	wait "$wpid"; wait "$cpid"
	s1=$(cpu "$pid") p1=$(pgcpu)
	n=$(awk '/requests in/ { print $1 }' "$out/$kind.wrk")
	rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out/$kind.wrk")
	grep -q Non-2xx "$out/$kind.wrk" && echo "warning: $kind: $(grep Non-2xx "$out/$kind.wrk")" >&2
	awk -v k="$kind" -v r="$rps" -v n="$n" -v s=$((s1 - s0)) -v p=$((p1 - p0)) -v w="$w" -v hz="$hz" 'BEGIN {
		f = 1e6 / hz / n; printf "%-12s %9.0f %12.1f %12.1f %12.1f %12.1f\n", k, r, s * f, p * f, w * f, (s + p + w) * f }'
	go tool pprof -top -nodecount 45 "$out/$kind.pprof" >"$out/$kind.top" 2>/dev/null || true
	go tool pprof -top -cum -nodecount 60 "$out/$kind.pprof" >"$out/$kind.cum" 2>/dev/null || true
	if ((pss)); then
		psql -q "$dsn" -c "SELECT calls, round((total_exec_time / calls)::numeric * 1000, 1) AS mean_us,
			round((total_exec_time / $n)::numeric * 1000, 1) AS us_per_req, rows / calls AS rows,
			round(wal_bytes / calls) AS wal_b, round(wal_records::numeric / calls, 1) AS wal_rec,
			round(shared_blks_dirtied::numeric / calls, 2) AS dirtied, round(shared_blks_hit::numeric / calls, 1) AS hit,
			left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS query
			FROM pg_stat_statements WHERE calls >= $n / 2 ORDER BY total_exec_time DESC LIMIT 15" >"$out/$kind.stmts"
	fi
done
done
echo "(profiles, top functions and statements in $out)"
