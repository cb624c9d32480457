#!/usr/bin/env bash
# Where the time of `cairn put` goes (issue 19): each stage alone on the same data in one
# process (bench/stages: read, FastCDC, chunk key, compression decision + zstd, nonce +
# AES-GCM, chunk ID, local store Put, metadata commit on an embedded etcd), and the whole put
# through cli.Main, for 10,000 files of 4 KiB and one incompressible file (256 MiB;
# LARGE_MIB=2048 by hand). Prints one table per data set: each stage's throughput and the bound
# it sets, the whole put, and its overhead over the slowest stage. CPU profiles of the two whole
# puts go to bench/profiles/put-{small,large}.prof (gitignored) with their
# `go tool pprof -top` (20 nodes) beside them as .top.txt and `-top -cum` (40 nodes) as .cum.txt
# (both kept in the repository). The profiles are the command's own (cairn's --cpuprofile):
# the put alone, not the data's generation; the realm's etcd daemon is another process.
#
# Usage: [COUNT=1] [LARGE_MIB=256] [BENCH_TMP=/var/tmp] bench/stages.sh
# COUNT runs each benchmark that many times (medians). Records nothing by itself: copy the
# table into bench/RESULTS.md with the load (uptime) and the date.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$BENCH_DIR")
COUNT=${COUNT:-1}
export CAIRN_BENCH_LARGE_MIB=${LARGE_MIB:-256}
PROF=$BENCH_DIR/profiles
mkdir -p "$PROF"
WORK=$(mktemp -d "${BENCH_TMP:-/var/tmp}/cairn-stages-sh.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
GO="nice -n 19 go"

cd "$REPO_ROOT"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), cairn $(git rev-parse --short HEAD)$([[ -n $(git status --porcelain -- cmd internal bench/stages) ]] && echo +worktree), load at start: $(cut -d' ' -f1-3 /proc/loadavg), nproc $(nproc)"
echo "# command: COUNT=$COUNT LARGE_MIB=$CAIRN_BENCH_LARGE_MIB bench/stages.sh"
$GO test -c -o "$WORK/stages.test" ./bench/stages
BIN=$WORK/stages.test
OUT=$WORK/bench.txt
run() { "$BIN" -test.run '^$' -test.benchtime 1x -test.count "$COUNT" "$@" | tee -a "$OUT" >&2; }
run -test.bench '^BenchmarkStages$'
for set in small large; do
	export CAIRN_BENCH_PUT_CPUPROFILE=$PROF/put-$set.prof
	run -test.bench "^BenchmarkPut\$/^$set\$"
	unset CAIRN_BENCH_PUT_CPUPROFILE
	$GO tool pprof -top -nodecount=20 "$BIN" "$PROF/put-$set.prof" >"$PROF/put-$set.top.txt" 2>/dev/null
	$GO tool pprof -top -cum -nodecount=40 "$BIN" "$PROF/put-$set.prof" >"$PROF/put-$set.cum.txt" 2>/dev/null
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"

# The table: medians over COUNT runs of MB/s, files/s and MB/cpu-s per benchmark.
awk -v large_mib="$CAIRN_BENCH_LARGE_MIB" -v ncpu="$(nproc)" '
function median(s,   a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1]+0 > a[j]+0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
/^Benchmark(Stages|Put)\// {
	split($1, p, "/"); set = p[2]; st = p[3]; sub(/-[0-9]+$/, "", st); sub(/-[0-9]+$/, "", set)
	if ($1 ~ /^BenchmarkPut/) { sub(/-[0-9]+$/, "", p[2]); set = p[2]; st = "PUT" }
	for (i = 3; i < NF; i++) {
		if ($(i+1) == "MB/s") mb[set, st] = mb[set, st] " " $i
		if ($(i+1) == "files/s") fs[set, st] = fs[set, st] " " $i
		if ($(i+1) == "MB/cpu-s") cpu[set, st] = cpu[set, st] " " $i
	}
	if (!((set, st) in seen)) { seen[set, st] = 1; order[set] = order[set] " " st }
}
END {
	for (k = 1; k <= 2; k++) {
		set = k == 1 ? "small" : "large"
		printf "\n%s: %s\n\n", set, set == "small" ? "10,000 files of 4 KiB" : "one incompressible file of " large_mib " MiB"
		print "| stage | MB/s | files/s | MB/cpu-s | bound on put |"
		print "|---|---|---|---|---|"
		n = split(order[set], sts, " "); slow = ""; inv = 0
		for (i = 1; i <= n; i++) {
			st = sts[i]; if (st == "PUT") continue
			m = median(mb[set, st]); f = median(fs[set, st]); c = median(cpu[set, st])
			if (slow == "" || m + 0 < slowmb + 0) { slow = st; slowmb = m; slowfs = f }
			inv += 1 / c
			printf "| %s | %.1f | %.0f | %.1f | %s |\n", st, m, f, c, set == "small" ? sprintf("%.0f files/s", f) : sprintf("%.0f MB/s", m)
		}
		pm = median(mb[set, "PUT"]); pf = median(fs[set, "PUT"]); pc = median(cpu[set, "PUT"])
		printf "| **whole put** | **%.1f** | **%.0f** | %.1f | |\n", pm, pf, pc
		printf "\nslowest stage: %s (%.1f MB/s, %.0f files/s); CPU bound of all stages together on %d cores (%d / sum of CPU-s per MB): %.1f MB/s\n", slow, slowmb, slowfs, ncpu, ncpu, ncpu / inv
		printf "whole put = %.0f%% of the slowest stage (overhead %.2fx), %.0f%% of the CPU bound\n", 100 * pm / slowmb, slowmb / pm, 100 * pm * inv / ncpu
	}
}' "$OUT"
echo
for set in small large; do
	echo "# top of the whole put's CPU profile ($set), bench/profiles/put-$set.top.txt:"
	sed -n '1,16p' "$PROF/put-$set.top.txt"
done
