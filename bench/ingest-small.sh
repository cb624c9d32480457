#!/usr/bin/env bash
# Ingest of 10,000 files of 4 KiB (random content, 100 directories of 100 files):
# `cairn put` into a fresh realm vs `restic backup` into a fresh local repository, then a
# second `cairn put` of the unchanged tree into the same realm.
# Acceptance: cairn first put >= 2,000 files/s (median); the second put adds no chunk
# (new_chunks == 0 in its --json summary, every run) and is >= 20x faster than the first
# (median of per-run wall-clock ratios).
# Usage: [RUNS=3] bench/ingest-small.sh
source "$(dirname "$0")/lib.sh"

NDIRS=100 PERDIR=100 FILESIZE=4096
NFILES=$((NDIRS * PERDIR))
MIN_FPS=2000
MIN_SPEEDUP=20

build_cairn

TREE=$CACHE/small-${NFILES}x${FILESIZE}
if [[ ! -f $TREE/.complete ]]; then
	echo "generating $TREE" >&2
	rm -rf "$TREE"
	for d in $(seq -w 0 $((NDIRS - 1))); do
		mkdir -p "$TREE/d$d"
		head -c $((PERDIR * FILESIZE)) /dev/urandom | split -b "$FILESIZE" -a 3 -d - "$TREE/d$d/f"
	done
	touch "$TREE/.complete"
fi
n=$(find "$TREE" -type f -name 'f*' | wc -l)
((n == NFILES)) || die "$TREE has $n files, want $NFILES (remove it to regenerate)"
# Stage a copy without the marker file so both tools see exactly the 10,000 files.
SRC=$WORK/small
rsync -a --exclude=.complete "$TREE/" "$SRC/"
find "$SRC" -type f -exec cat {} + >/dev/null # warm the page cache

c1=() c2=() cpu1=() dcpu1=() c_fps=() r_fps=() speedups=() js2=() rows=() chunks_ok=1
for i in $(seq 1 "$RUNS"); do
	w1=- fps=- w2=- sp=- nc2=- j1=- j2=- rw=- rfps=-
	if want cairn; then
		realm=$WORK/realm-$i
		new_realm "$realm"
		d0=$(daemon_cpu_s "$realm")
		timed "$WORK/cairn-$i-a" env CAIRN_HOME="$realm" "$CAIRN" put --json "$SRC" home:/
		w1=$T_WALL fps=$(calc "$NFILES / $w1")
		cpu1+=("$(calc "$T_USER + $T_SYS")") dcpu1+=("$(calc "$(daemon_cpu_s "$realm") - $d0")")
		j1=$(jq -r '.seconds' "$WORK/cairn-$i-a.out")
		files1=$(jq -r '.files' "$WORK/cairn-$i-a.out")
		[[ $files1 == "$NFILES" ]] || echo "warning: first put reports files=$files1, want $NFILES" >&2
		timed "$WORK/cairn-$i-b" env CAIRN_HOME="$realm" "$CAIRN" put --json "$SRC" home:/
		w2=$T_WALL sp=$(calc "$w1 / $w2")
		j2=$(jq -r '.seconds' "$WORK/cairn-$i-b.out")
		nc2=$(jq -r '.new_chunks' "$WORK/cairn-$i-b.out")
		[[ $nc2 == 0 ]] || chunks_ok=0
		c1+=("$w1") c2+=("$w2") c_fps+=("$fps") speedups+=("$sp") js2+=("$(calc "$j1 / $j2")")
		remove_realm "$realm"
	fi
	if want restic; then
		repo=$WORK/restic-$i
		new_restic_repo "$repo"
		timed "$WORK/restic-$i" restic backup --repo "$repo" --json "$SRC"
		rw=$T_WALL rfps=$(calc "$NFILES / $rw")
		r_fps+=("$rfps")
		rm -rf "$repo"
	fi
	rows+=("| $i | $w1 | $fps | $w2 | $nc2 | $sp | $j1 / $j2 | $rw | $rfps |")
	echo "run $i: cairn put ${w1}s ($fps files/s), again ${w2}s (new_chunks $nc2, ${sp}x); restic ${rw}s ($rfps files/s)" >&2
done

C_FPS=- C1=- C2=- SPEEDUP=- JSP=- R_FPS=- verdict="no acceptance check (TOOLS=$TOOLS)"
want restic && R_FPS=$(median "${r_fps[@]}")
if want cairn; then
	C_FPS=$(median "${c_fps[@]}") C1=$(median "${c1[@]}") C2=$(median "${c2[@]}")
	SPEEDUP=$(median "${speedups[@]}") JSP=$(median "${js2[@]}")
	fails=()
	ge "$C_FPS" "$MIN_FPS" || fails+=("files/s")
	((chunks_ok)) || fails+=("new chunks on second put")
	ge "$SPEEDUP" "$MIN_SPEEDUP" || fails+=("second put speedup")
	if ((${#fails[@]})); then verdict="FAIL ($(IFS=,; echo "${fails[*]}" | sed "s/,/, /g"))"; else verdict=PASS; fi
fi

if want cairn; then
	figure "first put s" "$C1"
	figure "first put files/s" "$C_FPS"
	figure "second put s" "$C2"
	# CPU seconds: the work done, whatever else the machine runs
	figure "first put CPU s (user + sys)" "$(median "${cpu1[@]}")"
	figure "etcd daemon CPU s during the first put" "$(median "${dcpu1[@]}")"
fi
want restic && figure "restic files/s" "$R_FPS"

record "ingest of $NFILES files of $FILESIZE bytes, then an unchanged second put" <<END
Per run: fresh realm / repo (init not timed); \`cairn put --json DIR home:/\` twice into the same
realm (the second over the unchanged tree), and \`restic backup --repo REPO --json DIR\` into a
fresh repo, each under \`/usr/bin/time -v\`; wall clock of the whole process. "json s" is the
\`seconds\` field of each put's --json summary (time inside the command).

| run | cairn 1st s | cairn files/s | cairn 2nd s | 2nd new_chunks | 1st/2nd (wall) | json s 1st / 2nd | restic s | restic files/s |
|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${rows[@]}")

Medians: cairn **$C_FPS files/s** (acceptance ≥ $MIN_FPS), restic **$R_FPS files/s**; cairn first put
$C1 s, second put $C2 s, speedup **${SPEEDUP}×** wall clock (acceptance ≥ ${MIN_SPEEDUP}×; by the
--json seconds: ${JSP}×); second put new_chunks == 0 in every run: $( ((chunks_ok)) && echo yes || echo NO). **$verdict**
END
[[ $verdict != FAIL* ]]
