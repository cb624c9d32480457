#!/usr/bin/env bash
# The cost of one FUSE round trip on this machine (issue 4: the floor under the mount's
# tar x and git clone). bench/fusert serves a file system that does nothing (go-fuse, no
# attribute cache: every fstat is a GETATTR request); a second process fstats its file
# 20,000 times per run. Placements: as the scheduler puts them, both pinned to one CPU
# (taskset -c 0), and pinned to different CPUs. Medians of RUNS per placement, µs per call;
# a local fstat (no FUSE) beside them.
TOOLS=${TOOLS:-fusert}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
CAIRN_COMMIT="- (fusert at $(cd "$REPO_ROOT" && git rev-parse --short HEAD))"
command -v taskset >/dev/null || die "missing taskset (util-linux)"
[[ -e /dev/fuse ]] || die "no /dev/fuse"
echo "building bench/fusert" >&2
(cd "$REPO_ROOT" && go build -o "$WORK/fusert" ./bench/fusert) || die "go build ./bench/fusert failed"
MNT=$WORK/mnt
mkdir -p "$MNT"
echo x >"$WORK/local"
SRV=
stop_srv() {
	if [[ -n $SRV ]]; then
		kill "$SRV" 2>/dev/null || true
		wait "$SRV" 2>/dev/null || true
		SRV=
	fi
}
trap 'stop_srv; fusermount3 -u "$MNT" 2>/dev/null || true; cleanup' EXIT

declare -A R
for run in $(seq "$RUNS"); do
	for place in free same apart; do
		case $place in
		free) s=() c=() ;;
		same) s=(taskset -c 0) c=(taskset -c 0) ;;
		apart) s=(taskset -c 0) c=(taskset -c 1) ;;
		esac
		"${s[@]}" "$WORK/fusert" serve "$MNT" &
		SRV=$!
		for _ in $(seq 100); do
			grep -q " $MNT fuse" /proc/self/mounts && break
			sleep 0.05
		done
		R[$place,$run]=$("${c[@]}" "$WORK/fusert" stat "$MNT/f" 20000)
		stop_srv
	done
	R[local,$run]=$("$WORK/fusert" stat "$WORK/local" 20000)
done
col() {
	local r out=()
	for r in $(seq "$RUNS"); do out+=("${R[$1,$r]}"); done
	echo "${out[@]}"
}
record "FUSE round trip on this machine (a null go-fuse file system)" <<EOF2
\`fusert stat\` (20,000 fstat of one file, each a GETATTR request: no attribute cache) against
\`fusert serve\` (go-fuse, answers from memory). µs per call, every run:

| placement | runs | median |
|---|---|---|
| as the scheduler puts them | $(col free) | **$(median $(col free))** |
| both pinned to CPU 0 | $(col same) | **$(median $(col same))** |
| pinned to CPUs 0 and 1 | $(col apart) | **$(median $(col apart))** |
| local fstat, no FUSE | $(col local) | $(median $(col local)) |

Guest halt polling (\`/sys/module/haltpoll/parameters/guest_halt_poll_ns\`): $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null || echo n/a); cpuidle governor: $(cat /sys/devices/system/cpu/cpuidle/current_governor 2>/dev/null || echo n/a).
EOF2
