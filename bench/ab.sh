#!/usr/bin/env bash
# A/B comparison of two cairn binaries with one harness, in one run: the harness runs RUNS
# times with each binary, alternating A, B, A, B, ... (RUNS=1 in each invocation: a fresh work
# dir, realm and mount each time, the same inputs from the bench cache), and every figure it
# reports through lib.sh's `figure` is tabled with each pair's ratio B / A and the median of
# the per-pair ratios. The invocations record nothing themselves (BENCH_RESULTS=/dev/null);
# this script appends one section to RESULTS.md (BENCH_RESULTS as in lib.sh).
#
# Usage: A=BINARY B=BINARY [A_NAME=a] [B_NAME=b] [RUNS=5] [RETRIES=1] bench/ab.sh HARNESS.sh
#   e.g. A=/tmp/cairn-old B=/tmp/cairn-new A_NAME=850bc79 B_NAME=HEAD TOOLS=cairn bench/ab.sh ingest-small.sh
# Other environment (TOOLS, SIZE_MIB, MOUNT_OPTS, SETTLE, BENCH_CACHE, ...) is passed on to the
# harness. A harness's acceptance failure (exit 1) is noted and its figures kept; an invocation
# that fails (exit 2: a command failed, e.g. on an overloaded machine) is noted with its first
# error line and run again, up to RETRIES times, then stops the comparison.
USER_TOOLS=${TOOLS:-}
RUNS=${RUNS:-5}
RETRIES=${RETRIES:-1}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

HARNESS=${1:-}
[[ -n $HARNESS ]] || die "usage: A=BINARY B=BINARY [RUNS=5] bench/ab.sh HARNESS.sh"
HARNESS=$BENCH_DIR/$(basename "$HARNESS")
[[ -x $HARNESS && $HARNESS != "$BENCH_DIR/ab.sh" ]] || die "no harness $HARNESS"
declare -A BIN NAME
for s in A B; do
	BIN[$s]=$(command -v "${!s:-}") || die "$s=${!s:-} is not a binary"
	n=${s}_NAME
	NAME[$s]=${!n:-$s}
done
CAIRN_COMMIT="A = ${NAME[A]} (${BIN[A]}), B = ${NAME[B]} (${BIN[B]})"

declare -A F LOAD # F[side,pair,figure], LOAD[side,pair]
names=()
notes=()
for i in $(seq 1 "$RUNS"); do
	for s in A B; do
		figs=$WORK/figures-$s-$i.tsv log=$WORK/$s-$i.log rc=0
		: >"$figs"
		LOAD[$s,$i]=$(cut -d' ' -f1 /proc/loadavg)
		echo "pair $i: $s (${NAME[$s]}), load ${LOAD[$s,$i]}" >&2
		envs=(RUNS=1 "CAIRN=${BIN[$s]}" BENCH_RESULTS=/dev/null "BENCH_FIGURES=$figs")
		[[ -z $USER_TOOLS ]] || envs+=("TOOLS=$USER_TOOLS")
		for try in $(seq 0 "$RETRIES"); do
			rc=0
			: >"$figs"
			env -u TOOLS "${envs[@]}" "$HARNESS" >"$log" 2>&1 </dev/null || rc=$?
			((rc >= 2)) || break
			# The harness could not finish (a command failed): noted, and tried again.
			notes+=("pair $i, ${NAME[$s]}: failed (exit $rc): $({ grep -m1 '^cairn:' "$log" || grep -m1 -E '^(command failed|[a-z-]+\.sh):' "$log"; } | tail -c 300)")
			tail -n 30 "$log" >&2
		done
		if ((rc == 1)); then
			notes+=("pair $i, ${NAME[$s]}: the harness reported an acceptance failure (exit 1)")
		elif ((rc != 0)); then
			die "$(basename "$HARNESS") with ${NAME[$s]} failed $((RETRIES + 1)) times (exit $rc; KEEP=1 keeps $log)"
		fi
		while IFS=$'\t' read -r k v; do
			[[ $s$i != A1 ]] || names+=("$k")
			F[$s,$i,$k]=$v
		done <"$figs"
	done
done

rows=()
for k in "${names[@]}"; do
	a=() b=() r=()
	for i in $(seq 1 "$RUNS"); do
		av=${F[A,$i,$k]:--} bv=${F[B,$i,$k]:--}
		a+=("$av") b+=("$bv")
		if [[ $av =~ ^[0-9.e+-]+$ && $bv =~ ^[0-9.e+-]+$ ]] && ! ge 0 "$av"; then
			r+=("$(calc "$bv / $av")")
		else
			r+=(-)
		fi
	done
	m=-
	[[ " ${r[*]} " == *" - "* ]] || m=$(median "${r[@]}")
	rows+=("| $k | ${a[*]} | ${b[*]} | ${r[*]} | **$m** |")
done
loads=()
for i in $(seq 1 "$RUNS"); do loads+=("${LOAD[A,$i]}/${LOAD[B,$i]}"); done

record "A/B: $(basename "$HARNESS"), A = ${NAME[A]}, B = ${NAME[B]}" <<END
$(basename "$HARNESS") run $((2 * RUNS)) times with RUNS=1, alternating A, B, A, B, ... (TOOLS=${USER_TOOLS:-its default});
each invocation a fresh work dir and realm, the same cached inputs. Per figure: each pair's value for A and for
B (in run order), the ratio B / A per pair, and the median of those ratios (for s, B and MB above 1 means B
is slower or larger; for ops/s, files/s and MB/s below 1 means B is slower). 1-minute load at the start of
each invocation (A/B): ${loads[*]}.$( ((${#notes[@]})) && printf '\nNotes: %s.' "$(IFS=';'; echo "${notes[*]}" | sed 's/;/; /g')")

| figure | A per pair | B per pair | B / A per pair | median B / A |
|---|---|---|---|---|
$(printf '%s\n' "${rows[@]}")
END
