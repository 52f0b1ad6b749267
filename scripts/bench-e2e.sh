#!/usr/bin/env bash
# End-to-end throughput of the example service (examples/orders) with wrk on
# loopback: idempotent POST /orders (a new key per request: first
# executions), the same route with one fixed key (replays), and the same
# handler in its own transaction without the middleware
# (POST /orders-unprotected, the hidden -unprotected-route flag), measured
# alternately in one run on SQLite, Postgres and MariaDB.
#
# -route settle measures the realistic payment transaction instead (lock
# the order row, insert the payment, update the order, insert an outbox
# row): POST /settle against POST /settle-unprotected.
#
#   scripts/bench-e2e.sh [-rounds N] [-duration 10s] [-conns 8] [-framework gin] [-store sql|gorm|pgx] [-route orders|settle]
#       [-dbs "sqlite postgres mysql"] [-out DIR] [-bin path/to/orders (default: built from examples/orders)]
#       [-server-args "-work-delay 5ms" (extra flags of the example service)]
#
# Postgres and MariaDB come from IDEM_TEST_POSTGRES_DSN and
# IDEM_TEST_MYSQL_DSN (see scripts/dbs.sh); the script creates and drops a
# database idem_bench_<pid> on each. Prints the median requests/s of each
# kind per database and the ratios; raw wrk output goes to the -out
# directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd -P)

rounds=5
duration=10s
conns=8
framework=gin
store=sql
route=orders
dbs="sqlite postgres mysql"
out=""
bin=""
server_args=""
while (($#)); do
	case "$1" in
	-rounds) rounds=$2; shift 2 ;;
	-duration) duration=$2; shift 2 ;;
	-conns) conns=$2; shift 2 ;;
	-framework) framework=$2; shift 2 ;;
	-store) store=$2; shift 2 ;;
	-route) route=$2; shift 2 ;;
	-dbs) dbs=$2; shift 2 ;;
	-out) out=$2; shift 2 ;;
	-bin) bin=$2; shift 2 ;;
	-server-args) server_args=$2; shift 2 ;;
	*) echo "bench-e2e.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
out=${out:-$(mktemp -d /tmp/idem-e2e-bench.XXXXXX)}
mkdir -p "$out"

if ! command -v wrk >/dev/null; then
	echo "bench-e2e.sh: installing wrk (Debian package)"
	apt-get install -y wrk >/dev/null
fi

if [[ -z $bin ]]; then
	bin="$out/orders"
	(cd examples && go build -o "$bin" ./orders)
fi

freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

bench_db="idem_bench_$$"
pg_admin=${IDEM_TEST_POSTGRES_DSN:-}
my_dsn=${IDEM_TEST_MYSQL_DSN:-}
cleanup() {
	[[ -n ${pid:-} ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	if [[ -n $pg_admin && $dbs == *postgres* ]]; then psql -q "$pg_admin" -c "DROP DATABASE IF EXISTS $bench_db" >/dev/null 2>&1 || true; fi
	if [[ -n $my_dsn && $dbs == *mysql* ]]; then mysql_cmd -e "DROP DATABASE IF EXISTS $bench_db" >/dev/null 2>&1 || true; fi
}
# mysql_cmd runs the mysql client with the user, password, host and port of
# IDEM_TEST_MYSQL_DSN (user:pass@tcp(host:port)/db?...).
mysql_cmd() {
	local up=${my_dsn%%@*} hp=${my_dsn#*tcp(}
	hp=${hp%%)*}
	mysql -u "${up%%:*}" -p"${up#*:}" -h "${hp%%:*}" -P "${hp#*:}" "$@"
}
trap cleanup EXIT

dsn_for() {
	case $1 in
	sqlite) echo "$out/orders.db" ;;
	postgres)
		psql -q "$pg_admin" -c "CREATE DATABASE $bench_db" >/dev/null
		local base=${pg_admin%%\?*} query=""
		[[ $pg_admin == *\?* ]] && query="?${pg_admin#*\?}"
		echo "${base%/*}/$bench_db$query" ;;
	mysql)
		mysql_cmd -e "CREATE DATABASE $bench_db" >/dev/null
		local base=${my_dsn%%\?*} query=""
		[[ $my_dsn == *\?* ]] && query="?${my_dsn#*\?}"
		echo "${base%/*}/$bench_db$query" ;;
	esac
}

# run KIND: one wrk run, prints requests/s (and warns about non-2xx).
run() {
	local kind=$1 script=fresh.lua path=/$route
	case $kind in
	unprotected) path=/$route-unprotected ;;
	replay) script=fixed.lua ;;
	esac
	local f="$out/$db-$kind-$round.txt"
	IDEM_PATH=$path IDEM_KEY="replay-$db-$$" wrk -t2 -c"$conns" -d"$duration" --latency -s "$root/scripts/e2e/$script" "http://127.0.0.1:$port" >"$f"
	if grep -q "Non-2xx" "$f"; then
		echo "warning: $db $kind round $round: $(grep Non-2xx "$f")" >&2
	fi
	awk '/^Requests\/sec:/ { print $2 }' "$f"
}

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }

summary=()
for db in $dbs; do
	if [[ $db != sqlite && ( -z $pg_admin && $db == postgres || -z $my_dsn && $db == mysql ) ]]; then
		echo "skipping $db: its DSN variable is not set" >&2
		continue
	fi
	dsn=$(dsn_for "$db")
	port=$(freeport)
	"$bin" -addr "127.0.0.1:$port" -framework "$framework" -store "$store" -db "$db" -dsn "$dsn" -unprotected-route $server_args 2>"$out/$db-server.log" &
	pid=$!
	for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
	# Warm-up (connections, caches, the replayed key's first execution).
	for kind in protected unprotected replay; do round=0 run $kind >/dev/null; done
	: >"$out/$db-protected.rps"; : >"$out/$db-unprotected.rps"; : >"$out/$db-replay.rps"
	for ((round = 1; round <= rounds; round++)); do
		for kind in protected unprotected replay; do
			run $kind >>"$out/$db-$kind.rps"
		done
		echo "$db round $round: protected $(tail -1 "$out/$db-protected.rps") unprotected $(tail -1 "$out/$db-unprotected.rps") replay $(tail -1 "$out/$db-replay.rps") req/s"
	done
	kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
	p=$(median <"$out/$db-protected.rps"); u=$(median <"$out/$db-unprotected.rps"); r=$(median <"$out/$db-replay.rps")
	summary+=("$(awk -v db="$db" -v p="$p" -v u="$u" -v r="$r" 'BEGIN { printf "%-9s %12.0f %12.0f %8.1f%% %12.0f %8.2fx", db, u, p, 100 * p / u, r, r / p }')")
done

echo
echo "framework=$framework server-args=${server_args:-none} store=$store route=$route rounds=$rounds duration=$duration conns=$conns (medians, requests/s)"
printf '%-9s %12s %12s %9s %12s %9s\n' db unprotected protected prot/unpr replay repl/prot
printf '%s\n' "${summary[@]}"
echo "(raw wrk output in $out)"
