#!/usr/bin/env bash
# Reruns the benchmark tables of BENCHMARKS.md.
#
#   scripts/bench.sh [-count N] [-benchtime D] [-out DIR] [-e2e] [-only core|ginidem|echoidem|chiidem]
#
# In-process overhead (always): builds the BenchmarkOverhead test binary of
# core (net/http), ginidem, echoidem and chiidem, then runs them in N rounds
# (default 10), each round running every binary once with -count 1, so the
# bare and protected sides of every row are measured close together in time
# on a noisy machine. Writes DIR/overhead-MODULE.txt (raw go test output),
# DIR/overhead-MODULE.benchstat (benchstat -col /mw: the protected column is
# a percentage over the bare one) and prints the summary table (medians of
# CPU and wall time per request, ratios idem/bare, extra allocations).
#
# Memory (unless -only): the memory store's bytes per record and the heap
# over a million replays (core/memstore TestMemoryFootprint).
#
# -e2e: also runs scripts/bench-e2e.sh (wrk against examples/orders on SQLite,
# Postgres and MariaDB; needs IDEM_TEST_POSTGRES_DSN and IDEM_TEST_MYSQL_DSN).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd -P)

count=10
benchtime=500ms
out=""
e2e=0
only=""
while (($#)); do
	case "$1" in
	-count) count=$2; shift 2 ;;
	-benchtime) benchtime=$2; shift 2 ;;
	-out) out=$2; shift 2 ;;
	-e2e) e2e=1; shift ;;
	-only) only=$2; shift 2 ;;
	*) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
out=${out:-$(mktemp -d /tmp/idem-bench.XXXXXX)}
mkdir -p "$out"

benchstat=$(command -v benchstat || echo "$(go env GOPATH)/bin/benchstat")
if [[ ! -x $benchstat ]]; then
	echo "bench.sh: installing benchstat (go install golang.org/x/perf/cmd/benchstat@latest)"
	(cd /tmp && go install golang.org/x/perf/cmd/benchstat@latest)
fi

modules=(core ginidem echoidem chiidem)
[[ -n $only ]] && modules=("$only")

echo "== building test binaries into $out"
for m in "${modules[@]}"; do
	if [[ $m == core ]]; then
		go test -c -o "$out/$m.test" ./core
	else
		(cd "$m" && go test -c -o "$out/$m.test" .)
	fi
	: >"$out/overhead-$m.txt"
done

echo "== $count rounds of BenchmarkOverhead (-benchtime $benchtime) per module"
for ((i = 1; i <= count; i++)); do
	for m in "${modules[@]}"; do
		"$out/$m.test" -test.run '^$' -test.bench '^BenchmarkOverhead$' -test.benchmem \
			-test.benchtime "$benchtime" -test.count 1 >>"$out/overhead-$m.txt"
	done
	printf '.'
done
echo

for m in "${modules[@]}"; do
	"$benchstat" -col /mw "$out/overhead-$m.txt" >"$out/overhead-$m.benchstat"
done

# Summary per path: medians of each side, the ratio idem/bare of the
# medians for CPU time per request (cpu-ns/op, the headline: a shared
# machine disturbs it least) and for wall time (ns/op), and the extra
# allocations and bytes per request.
summary() {
	awk -v mod="$1" '
	function median(a, n,    i, j, t) {
		for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	function med(k, unit,    i, x) { for (i = 1; i <= n[k]; i++) x[i] = v[k, unit, i]; return median(x, n[k]) }
	/^BenchmarkOverhead\/path=/ {
		split($1, p, "/"); path = substr(p[2], 6); mw = substr(p[3], 4); sub(/-[0-9]+$/, "", mw)
		k = path SUBSEP mw; n[k]++
		for (f = 3; f < NF; f += 2) v[k, $(f + 1), n[k]] = $f
		paths[path] = 1
	}
	END {
		split("first replay passthrough", order, " ")
		for (o = 1; o <= 3; o++) {
			path = order[o]; if (!(path in paths)) continue
			b = path SUBSEP "bare"; d = path SUBSEP "idem"
			cb = med(b, "cpu-ns/op"); cd = med(d, "cpu-ns/op"); wb = med(b, "ns/op"); wd = med(d, "ns/op")
			printf "%-9s %-12s %8.0f %8.0f %6.2fx %8.0f %8.0f %6.2fx %6d %6d\n", mod, path, cb, cd, cd / cb, wb, wd, wd / wb,
				med(d, "allocs/op") - med(b, "allocs/op"), med(d, "B/op") - med(b, "B/op")
		}
	}' "$2"
}
echo
printf '%-9s %-12s %8s %8s %7s %8s %8s %7s %6s %6s\n' module path cpu-bare cpu-idem ratio ns-bare ns-idem ratio +alloc +B
for m in "${modules[@]}"; do
	summary "$m" "$out/overhead-$m.txt"
done
echo "(raw output and benchstat tables in $out)"

if [[ -z $only ]]; then
	echo
	echo "== memory store footprint"
	IDEM_FOOTPRINT=1 go test -run '^TestMemoryFootprint$' -v -count 1 ./core/memstore/ | grep -E 'footprint|heap|ok|FAIL' || true
fi

if ((e2e)); then
	echo
	"$root/scripts/bench-e2e.sh"
fi
