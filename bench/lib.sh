# Shared helpers for the bench/*.sh harnesses. Source it; do not run it.
# shellcheck shell=bash
#
# Environment (all optional):
#   RUNS          runs per tool, medians reported (default 3)
#   CAIRN         a cairn binary to use (default: go build ./cmd/cairn of HEAD, see build_cairn)
#   BENCH_WORKTREE=1  build from the working tree (uncommitted edits) instead of HEAD
#   BENCH_CACHE   generated/downloaded inputs, kept between runs
#                 (default ${XDG_CACHE_HOME:-~/.cache}/cairn-bench)
#   BENCH_TMP     where fresh realms and restic repos are made (default /var/tmp)
#   BENCH_RESULTS file the dated section is appended to (default bench/RESULTS.md;
#                 /dev/null to record nothing)
#   KEEP=1        keep the work dir for inspection
#   TOOLS         which tools to run (default "cairn restic"); TOOLS=restic measures the
#                 baseline alone (no acceptance check, exit 0)
#   BENCH_FIGURES file the harness's main figures are appended to, one "NAME<TAB>VALUE" a
#                 line (see figure; bench/ab.sh reads them)

set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$BENCH_DIR")
RUNS=${RUNS:-3}
CACHE=${BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn-bench}
RESULTS=${BENCH_RESULTS:-$BENCH_DIR/RESULTS.md}
BENCH_CMD="$(basename "$0")${*:+ $*}"
TOOLS=${TOOLS:-cairn restic}
want() { [[ " $TOOLS " == *" $1 "* ]]; }
mkdir -p "$CACHE"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
WORK=$(mktemp -d "${BENCH_TMP:-/var/tmp}/cairn-bench.XXXXXX")

cleanup() {
	local r
	for r in "$WORK"/realm*/; do
		[[ -d $r ]] && stop_daemon "${r%/}"
	done
	if [[ ${KEEP:-0} == 1 ]]; then
		echo "work dir kept: $WORK" >&2
		return
	fi
	chmod -R u+w "$WORK" 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

export RESTIC_PASSWORD=cairn-bench
export RESTIC_CACHE_DIR=$WORK/restic-cache # restic's cache stays on (its default), but private

die() {
	echo "$(basename "$0"): $*" >&2
	exit 2
}

for c in restic jq rsync /usr/bin/time; do
	command -v "$c" >/dev/null || die "missing $c: run scripts/test-deps.sh"
done

# build_cairn: sets CAIRN to a binary built from this checkout's HEAD commit (a clean
# `git archive` snapshot, so the figures belong to a commit even while others have edits in
# the working tree), or from the working tree with BENCH_WORKTREE=1, unless CAIRN is set.
build_cairn() {
	CAIRN_COMMIT=-
	want cairn || return 0
	if [[ -n ${CAIRN:-} ]]; then
		CAIRN=$(command -v "$CAIRN") || die "CAIRN=$CAIRN not found"
		CAIRN_COMMIT="binary $CAIRN"
		return 0
	fi
	mkdir -p "$WORK/bin"
	local src=$REPO_ROOT
	CAIRN_COMMIT=$(cd "$REPO_ROOT" && git rev-parse --short HEAD)
	if [[ ${BENCH_WORKTREE:-0} == 1 ]]; then
		if [[ -n $(cd "$REPO_ROOT" && git status --porcelain -- cmd internal go.mod go.sum) ]]; then
			CAIRN_COMMIT="$CAIRN_COMMIT+worktree"
		fi
	else
		src=$WORK/src
		mkdir -p "$src"
		(cd "$REPO_ROOT" && git archive HEAD) | tar -x -C "$src"
	fi
	echo "building cairn $CAIRN_COMMIT" >&2
	(cd "$src" && go build -o "$WORK/bin/cairn" ./cmd/cairn) || die "go build ./cmd/cairn failed"
	CAIRN=$WORK/bin/cairn
}

# new_realm DIR: a fresh cairn realm in DIR (not timed).
new_realm() {
	rm -rf "$1"
	mkdir -p "$1"
	CAIRN_HOME=$1 "$CAIRN" init --no-passphrase >"$1.init.log" 2>&1 </dev/null ||
		{ cat "$1.init.log" >&2; die "cairn init failed"; }
}

# The embedded etcd runs in a daemon that the first cairn command of a realm starts (init
# does) and that exits after an idle linger (30 s). The harnesses leave it up between the
# commands of a run, like a shell loop of cairn commands, report its peak RSS beside the
# command's, and stop it before removing the realm.
daemon_pid() { # daemon_pid REALM: the pid serving the realm's etcd, or nothing
	local pid
	pid=$(awk '{ print $3 }' "$1/etcd/endpoint" 2>/dev/null) || return 0
	[[ -n $pid && -r /proc/$pid/environ ]] && tr '\0' '\n' <"/proc/$pid/environ" | grep -qx "CAIRN_HOME=$1" && echo "$pid"
	return 0
}
daemon_rss_mb() { # daemon_rss_mb REALM: the daemon's peak RSS (VmHWM) so far, MB, or "-"
	local pid
	pid=$(daemon_pid "$1")
	if [[ -n $pid ]]; then awk '/VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status"; else echo -; fi
}
daemon_cpu_s() { # daemon_cpu_s REALM: the daemon's CPU seconds (user + sys) so far, or 0
	local pid
	pid=$(daemon_pid "$1")
	if [[ -n $pid ]]; then awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$pid/stat"; else echo 0; fi
}
stop_daemon() { # stop_daemon REALM: SIGTERM the realm's daemon and wait for it to exit
	local pid i
	pid=$(daemon_pid "$1")
	[[ -n $pid ]] || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for i in $(seq 100); do
		# gone, or a zombie waiting to be reaped
		[[ $(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) =~ ^[^ZX]$ ]] || return 0
		sleep 0.1
	done
	echo "warning: cairn etcd daemon $pid for $1 still running after 10 s" >&2
}
remove_realm() { stop_daemon "$1"; rm -rf "$1"; }

# new_restic_repo DIR: a fresh local restic repository (not timed).
new_restic_repo() {
	rm -rf "$1"
	restic init --repo "$1" -q >/dev/null </dev/null || die "restic init $1 failed"
}

now() { date +%s.%N; }

# settle: before a timed command, let the previous run's writes and deletions (the realm or
# repository just removed; the disk is mounted with discard) reach the disk, so they are not
# billed to the next tool's run. Not timed. SETTLE=0 skips it.
settle() {
	[[ ${SETTLE:-3} == 0 ]] && return 0
	sync
	sleep "${SETTLE:-3}"
}

# timed PREFIX CMD...: runs CMD under /usr/bin/time -v, stdout to PREFIX.out, stderr to
# PREFIX.err. Sets T_WALL (seconds, wall clock around the whole process), T_RSS_MB
# (peak RSS of the process tree's largest process, from time -v) and T_USER, T_SYS (CPU
# seconds of the process and the children it waited for, from time -v). Dies if CMD fails.
timed() {
	local prefix=$1
	shift
	local t0 t1 rc=0
	t0=$(now)
	/usr/bin/time -v -o "$prefix.time" "$@" >"$prefix.out" 2>"$prefix.err" </dev/null || rc=$?
	t1=$(now)
	if ((rc != 0)); then
		echo "command failed (exit $rc): $*" >&2
		tail -n 20 "$prefix.err" >&2
		exit 2
	fi
	T_WALL=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
	T_END=$t1 # when the command had exited (unix s)
	T_RSS_MB=$(awk -F': ' '/Maximum resident set size/ { printf "%.1f", $2 / 1024 }' "$prefix.time")
	T_USER=$(awk -F': ' '/User time \(seconds\)/ { print $2 }' "$prefix.time")
	T_SYS=$(awk -F': ' '/System time \(seconds\)/ { print $2 }' "$prefix.time")
}

# figure NAME VALUE: with BENCH_FIGURES set, appends "NAME<TAB>VALUE" to it: the figures
# bench/ab.sh compares between two binaries. NAME ends with its unit (" s", " ops/s", " B").
figure() {
	[[ -n ${BENCH_FIGURES:-} ]] || return 0
	printf '%s\t%s\n' "$1" "$2" >>"$BENCH_FIGURES"
}

# median N...: the median of the numbers given.
median() {
	printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) exit 1
		if (NR % 2) printf "%.6g\n", v[(NR + 1) / 2]
		else printf "%.6g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# calc EXPR: floating-point arithmetic via awk, e.g. calc "2048 / 3.1".
calc() { awk "BEGIN { printf \"%.6g\n\", $1 }"; }

# ge A B: true when A >= B (floats).
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

machine() {
	local cpu mem
	cpu=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)
	mem=$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
	echo "nproc $(nproc), kernel $(uname -r), $cpu, $mem, $(. /etc/os-release && echo "$PRETTY_NAME"), $(go version 2>/dev/null | awk '{print $3}'), $(restic version | awk '{print $1, $2}'), cairn $CAIRN_COMMIT; load average at start $LOAD_START, at end $(cut -d" " -f1-3 /proc/loadavg)"
}

# record TITLE: appends a dated section with TITLE, the command, the machine and the
# body read from stdin to $RESULTS, and echoes it.
record() {
	local title=$1 body
	body=$(cat)
	if [[ ! -s $RESULTS && $RESULTS != /dev/null ]]; then
		printf '# cairn benchmark results\n\nAppended by the harnesses in bench/ (see bench/README.md); newest at the end.\n' >"$RESULTS"
	fi
	{
		printf '\n## %s — %s\n\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" "$title"
		printf -- '- command: `%s` (RUNS=%s, TOOLS="%s")\n' "bench/$BENCH_CMD" "$RUNS" "$TOOLS"
		printf -- '- machine: %s\n\n' "$(machine)"
		printf '%s\n' "$body"
	} | tee -a "$RESULTS"
}

# xtools_dirs V...: fills the associative array DIRS (declare it first: declare -A DIRS) with
# the extracted tree of each golang.org/x/tools version, from a private module cache under the
# bench cache (reproducible inputs, downloaded once).
xtools_dirs() {
	local ver dir err
	while IFS=$'\t' read -r ver dir err; do
		[[ -z $err ]] || die "go mod download golang.org/x/tools@$ver: $err"
		DIRS[$ver]=$dir
	done < <(cd "$WORK" && GOMODCACHE=$CACHE/gomodcache GOFLAGS=-modcacherw GO111MODULE=on \
		go mod download -json "${@/#/golang.org/x/tools@}" |
		jq -r '[.Version, .Dir, (.Error // "")] | @tsv')
	for ver in "$@"; do [[ -d ${DIRS[$ver]:-} ]] || die "no extracted tree for x/tools@$ver"; done
}
