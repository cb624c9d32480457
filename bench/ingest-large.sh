#!/usr/bin/env bash
# Ingest of one 2 GiB incompressible file: `cairn put` into a fresh realm vs `restic backup`
# into a fresh local repository, interleaved run by run on the same warm file.
# Acceptance: cairn throughput >= 2.5x restic's (median of per-run ratios), and cairn's
# peak RSS < 300 MB. Usage: [RUNS=3] [SIZE_MIB=2048] bench/ingest-large.sh
source "$(dirname "$0")/lib.sh"

SIZE_MIB=${SIZE_MIB:-2048}
MIN_RATIO=2.5
MAX_RSS_MB=300

build_cairn

INPUT=$CACHE/random-${SIZE_MIB}MiB.bin
if [[ $(stat -c %s "$INPUT" 2>/dev/null || echo 0) != $((SIZE_MIB * 1048576)) ]]; then
	echo "generating $INPUT from /dev/urandom" >&2
	head -c "$((SIZE_MIB * 1048576))" /dev/urandom >"$INPUT.tmp"
	mv "$INPUT.tmp" "$INPUT"
fi
cat "$INPUT" >/dev/null # warm the page cache; both tools read the same cached file
MB=$(calc "$SIZE_MIB * 1048576 / 1e6")

c_mbs=() c_s=() c_cpu=() c_dcpu=() r_mbs=() ratios=() c_rss=() r_rss=() rows=()
for i in $(seq 1 "$RUNS"); do
	cw=- crss=- cmbs=- rw=- rrss=- rmbs=- ratio=-
	if want cairn; then
		realm=$WORK/realm-$i
		new_realm "$realm"
		settle
		d0=$(daemon_cpu_s "$realm")
		timed "$WORK/cairn-$i" env CAIRN_HOME="$realm" "$CAIRN" put --json "$INPUT" home:/
		cw=$T_WALL cmbs=$(calc "$MB / $cw")
		c_cpu+=("$(calc "$T_USER + $T_SYS")") c_dcpu+=("$(calc "$(daemon_cpu_s "$realm") - $d0")")
		drss=$(daemon_rss_mb "$realm")
		# the put process plus the etcd daemon it talks to (a separate process)
		crss=$(calc "$T_RSS_MB + ${drss/-/0}")
		crss="$crss ($T_RSS_MB + $drss)"
		c_mbs+=("$cmbs") c_rss+=("${crss%% *}") c_s+=("$cw")
		remove_realm "$realm"
	fi
	if want restic; then
		repo=$WORK/restic-$i
		new_restic_repo "$repo"
		settle
		timed "$WORK/restic-$i" restic backup --repo "$repo" --json "$INPUT"
		rw=$T_WALL rrss=$T_RSS_MB rmbs=$(calc "$MB / $rw")
		r_mbs+=("$rmbs") r_rss+=("$rrss")
		rm -rf "$repo"
	fi
	if want cairn && want restic; then
		ratio=$(calc "$rw / $cw")
		ratios+=("$ratio")
	fi
	rows+=("| $i | $cw | $cmbs | $crss | $rw | $rmbs | $rrss | $ratio |")
	echo "run $i: cairn ${cw}s $cmbs MB/s $crss MB RSS; restic ${rw}s $rmbs MB/s $rrss MB RSS; ratio $ratio" >&2
done

C_MBS=- R_MBS=- RATIO=- C_RSS=- R_RSS=- verdict="no acceptance check (TOOLS=$TOOLS)"
want cairn && C_MBS=$(median "${c_mbs[@]}") && C_RSS=$(printf '%s\n' "${c_rss[@]}" | sort -g | tail -1)
want restic && R_MBS=$(median "${r_mbs[@]}") && R_RSS=$(median "${r_rss[@]}")
if want cairn && want restic; then
	RATIO=$(median "${ratios[@]}")
	verdict=PASS
	ge "$RATIO" "$MIN_RATIO" || verdict="FAIL (ratio)"
	lt "$C_RSS" "$MAX_RSS_MB" || if [[ $verdict == PASS ]]; then verdict="FAIL (RSS)"; else verdict="FAIL (ratio, RSS)"; fi
fi

if want cairn; then
	figure "put s" "$(median "${c_s[@]}")"
	figure "put MB/s" "$C_MBS"
	figure "put CPU s (user + sys)" "$(median "${c_cpu[@]}")"
	figure "etcd daemon CPU s during the put" "$(median "${c_dcpu[@]}")"
	figure "peak RSS MB (put + etcd daemon, max)" "$C_RSS"
fi
want restic && figure "restic MB/s" "$R_MBS"

record "ingest of one ${SIZE_MIB} MiB incompressible file" <<END
Per run: fresh realm / repo (init not timed), then \`cairn put --json FILE home:/\` and
\`restic backup --repo REPO --json FILE\` (repo from \`restic init\`, default compression and cache),
each under \`/usr/bin/time -v\`, on the same page-cached file, each after \`sync; sleep ${SETTLE:-3}\`
(not timed: the previous run's removed realm or repo is flushed and discarded first); wall clock of the whole process;
MB = 10^6 bytes. cairn's peak RSS is the put process's (time -v) plus the peak (VmHWM) of the
realm's embedded-etcd daemon, which \`cairn init\` started and the put connected to.

| run | cairn s | cairn MB/s | cairn peak RSS MB (put + etcd daemon) | restic s | restic MB/s | restic peak RSS MB | restic s / cairn s |
|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${rows[@]}")

Medians: cairn **$C_MBS MB/s**, restic **$R_MBS MB/s**, ratio **${RATIO}×** (median of per-run
ratios; acceptance ≥ ${MIN_RATIO}×). cairn peak RSS (put + daemon, max over runs) **$C_RSS MB** (acceptance
< $MAX_RSS_MB MB); restic median peak RSS $R_RSS MB. **$verdict**
END
[[ $verdict != FAIL* ]]
