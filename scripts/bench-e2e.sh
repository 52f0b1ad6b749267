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
#       [-delay 250us (one-way delay of a proxy in front of the database)]
#
# -delay D puts a proxy (examples/delayproxy, started by the script) between
# the service and Postgres/MariaDB that delays each direction by D, as a
# database one network hop away would (250us: a 0.5 ms round trip), and
# reports the p50 and p99 latency of each kind next to the throughput (use
# few connections, e.g. -conns 4, to measure latency rather than queueing).
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
delay=""
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
	-delay) delay=$2; shift 2 ;;
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

if [[ -n $delay ]]; then
	(cd examples && go build -o "$out/delayproxy" ./delayproxy)
fi

freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

bench_db="idem_bench_$$"
pg_admin=${IDEM_TEST_POSTGRES_DSN:-}
my_dsn=${IDEM_TEST_MYSQL_DSN:-}
cleanup() {
	[[ -n ${pid:-} ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	[[ -n ${proxy_pid:-} ]] && kill "$proxy_pid" 2>/dev/null && wait "$proxy_pid" 2>/dev/null || true
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

# via_proxy: starts the delay proxy in front of $dsn's host:port and
# points $dsn at the proxy instead.
via_proxy() {
	local hp
	case $dsn in
	*tcp\(*) hp=${dsn#*tcp(}; hp=${hp%%)*} ;; # user:pass@tcp(host:port)/db
	*) hp=${dsn#*@}; hp=${hp%%/*} ;;           # postgres://user:pass@host:port/db
	esac
	local pport
	pport=$(freeport)
	"$out/delayproxy" -listen "127.0.0.1:$pport" -target "$hp" -delay "$delay" >/dev/null 2>"$out/$db-proxy.log" &
	proxy_pid=$!
	for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$pport") 2>/dev/null && break; sleep 0.1; done
	dsn=${dsn/$hp/127.0.0.1:$pport}
}

# run KIND: one wrk run, prints requests/s (and warns about non-2xx).
run() {
	local kind=$1 script=fresh.lua path=/$route
	case $kind in
	unprotected) path=/$route-unprotected ;;
	replay) script=fixed.lua ;;
	esac
	local f="$out/$db-$kind-$round.txt"
	IDEM_PATH=$path IDEM_KEY="replay-$db-$$" wrk -t"$(( conns < 2 ? conns : 2 ))" -c"$conns" -d"$duration" --latency -s "$root/scripts/e2e/$script" "http://127.0.0.1:$port" >"$f"
	if grep -q "Non-2xx" "$f"; then
		echo "warning: $db $kind round $round: $(grep Non-2xx "$f")" >&2
	fi
	awk '/^Requests\/sec:/ { print $2 }' "$f"
	# p50 and p99 in ms (wrk prints them as 1.23ms, 456.00us or 1.02s).
	awk '/^ +(50|99)%/ { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v); f = (u == "us" ? 0.001 : u == "s" ? 1000 : 1); printf "%s%.3f", (n++ ? " " : ""), v * f } END { print "" }' "$f" >>"$out/$db-$kind.lat"
}

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }

summary=()
latency=()
for db in $dbs; do
	if [[ $db != sqlite && ( -z $pg_admin && $db == postgres || -z $my_dsn && $db == mysql ) ]]; then
		echo "skipping $db: its DSN variable is not set" >&2
		continue
	fi
	dsn=$(dsn_for "$db")
	if [[ -n $delay && $db != sqlite ]]; then
		via_proxy
	fi
	port=$(freeport)
	"$bin" -addr "127.0.0.1:$port" -framework "$framework" -store "$store" -db "$db" -dsn "$dsn" -unprotected-route $server_args 2>"$out/$db-server.log" &
	pid=$!
	for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
	# Warm-up (connections, caches, the replayed key's first execution).
	for kind in protected unprotected replay; do round=0 run $kind >/dev/null; done
	: >"$out/$db-protected.rps"; : >"$out/$db-unprotected.rps"; : >"$out/$db-replay.rps"
	: >"$out/$db-protected.lat"; : >"$out/$db-unprotected.lat"; : >"$out/$db-replay.lat"
	for ((round = 1; round <= rounds; round++)); do
		for kind in protected unprotected replay; do
			run $kind >>"$out/$db-$kind.rps"
		done
		echo "$db round $round: protected $(tail -1 "$out/$db-protected.rps") unprotected $(tail -1 "$out/$db-unprotected.rps") replay $(tail -1 "$out/$db-replay.rps") req/s"
	done
	kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
	if [[ -n ${proxy_pid:-} ]]; then kill "$proxy_pid"; wait "$proxy_pid" 2>/dev/null || true; proxy_pid=""; fi
	p=$(median <"$out/$db-protected.rps"); u=$(median <"$out/$db-unprotected.rps"); r=$(median <"$out/$db-replay.rps")
	summary+=("$(awk -v db="$db" -v p="$p" -v u="$u" -v r="$r" 'BEGIN { printf "%-9s %12.0f %12.0f %8.1f%% %12.0f %8.2fx", db, u, p, 100 * p / u, r, r / p }')")
	# Latency: medians over the rounds of each kind's p50 and p99 (ms).
	lat=()
	for kind in unprotected protected replay; do
		lat+=("$(cut -d' ' -f1 "$out/$db-$kind.lat" | median)" "$(cut -d' ' -f2 "$out/$db-$kind.lat" | median)")
	done
	latency+=("$(awk -v db="$db" -v up50="${lat[0]}" -v up99="${lat[1]}" -v p50="${lat[2]}" -v p99="${lat[3]}" -v r50="${lat[4]}" -v r99="${lat[5]}" \
		'BEGIN { printf "%-9s %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %7.2fx %7.2fx %7.2fx", db, up50, up99, p50, p99, r50, r99, p50 / up50, p99 / up99, r50 / p50 }')")
done

echo
echo "framework=$framework server-args=${server_args:-none} delay=${delay:-none} store=$store route=$route rounds=$rounds duration=$duration conns=$conns (medians, requests/s)"
printf '%-9s %12s %12s %9s %12s %9s\n' db unprotected protected prot/unpr replay repl/prot
printf '%s\n' "${summary[@]}"
echo
echo "latency (ms; medians over the rounds of each run's p50 and p99${delay:+; database behind a proxy delaying each way by $delay})"
printf '%-9s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n' db unpr-p50 unpr-p99 prot-p50 prot-p99 repl-p50 repl-p99 p50-ratio p99-ratio repl/prot
printf '%s\n' "${latency[@]}"
echo "(raw wrk output in $out)"
