#!/usr/bin/env bash
# Ingest of 10,000 files of 4 KiB (random content, 100 directories of 100 files):
# `cairn put` into a fresh realm vs `restic backup` into a fresh local repository and
# `borg create` into a fresh borg repository (Debian's borgbackup, when installed), then a
# second put / backup / create of the unchanged tree into the same realm / repository.
# Acceptance (issue 19): cairn's first put at least as fast as restic's and borg's first
# backup (median of per-run ratios); the second put adds no chunk (new_chunks == 0 in its
# --json summary, every run), is >= 20x faster than the first (median of per-run wall-clock
# ratios) and no slower than restic's second backup (median of per-run ratios).
# Usage: [RUNS=3] [TOOLS="cairn restic borg"] bench/ingest-small.sh
if [[ -z ${TOOLS:-} ]]; then
	TOOLS="cairn restic"
	command -v borg >/dev/null && TOOLS="$TOOLS borg"
fi
source "$(dirname "$0")/lib.sh"
export BORG_PASSPHRASE=cairn-bench BORG_BASE_DIR=$WORK/borg-base

NDIRS=100 PERDIR=100 FILESIZE=4096
NFILES=$((NDIRS * PERDIR))
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

c1=() c2=() cpu1=() dcpu1=() c_fps=() r_fps=() b_fps=() speedups=() js2=() rows=() chunks_ok=1
vs_r=() vs_b=() vs_r2=() vs_b2=() r2s=() b2s=()
for i in $(seq 1 "$RUNS"); do
	w1=- fps=- w2=- sp=- nc2=- j1=- j2=- rw=- rfps=- rw2=- bw=- bfps=- bw2=-
	if want cairn; then
		settle
		realm=$WORK/realm-$i
		new_realm "$realm"
		d0=$(daemon_cpu_s "$realm")
		timed "$WORK/cairn-$i-a" env CAIRN_HOME="$realm" "$CAIRN" put --json "$SRC" home:/
		w1=$T_WALL fps=$(calc "$NFILES / $w1")
		cpu1+=("$(calc "$T_USER + $T_SYS")") dcpu1+=("$(calc "$(daemon_cpu_s "$realm") - $d0")")
		j1=$(jq -r '.seconds' "$WORK/cairn-$i-a.out")
		files1=$(jq -r '.files' "$WORK/cairn-$i-a.out")
		[[ $files1 == "$NFILES" ]] || echo "warning: first put reports files=$files1, want $NFILES" >&2
		settle
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
		settle
		timed "$WORK/restic-$i" restic backup --repo "$repo" --json "$SRC"
		rw=$T_WALL rfps=$(calc "$NFILES / $rw")
		settle
		timed "$WORK/restic-$i-b" restic backup --repo "$repo" --json "$SRC"
		rw2=$T_WALL
		r_fps+=("$rfps") r2s+=("$rw2")
		rm -rf "$repo"
		if want cairn; then vs_r+=("$(calc "$fps / $rfps")") vs_r2+=("$(calc "$rw2 / $w2")"); fi
	fi
	if want borg; then
		repo=$WORK/borg-$i
		rm -rf "$repo"
		borg init --encryption=repokey "$repo" </dev/null >/dev/null 2>&1 || die "borg init $repo failed"
		settle
		timed "$WORK/borg-$i" borg create "$repo::a" "$SRC"
		bw=$T_WALL bfps=$(calc "$NFILES / $bw")
		settle
		timed "$WORK/borg-$i-b" borg create "$repo::b" "$SRC"
		bw2=$T_WALL
		b_fps+=("$bfps") b2s+=("$bw2")
		rm -rf "$repo" "$BORG_BASE_DIR"
		if want cairn; then vs_b+=("$(calc "$fps / $bfps")") vs_b2+=("$(calc "$bw2 / $w2")"); fi
	fi
	rows+=("| $i | $w1 | $fps | $w2 | $nc2 | $sp | $j1 / $j2 | $rw | $rfps | $rw2 | $bw | $bfps | $bw2 |")
	echo "run $i: cairn put ${w1}s ($fps files/s), again ${w2}s (new_chunks $nc2, ${sp}x); restic ${rw}s ($rfps files/s), again ${rw2}s; borg ${bw}s ($bfps files/s), again ${bw2}s" >&2
done

C_FPS=- C1=- C2=- SPEEDUP=- JSP=- R_FPS=- R2=- B_FPS=- B2=- VS_R=- VS_B=- VS_R2=- VS_B2=- verdict="no acceptance check (TOOLS=$TOOLS)"
want restic && R_FPS=$(median "${r_fps[@]}") R2=$(median "${r2s[@]}")
want borg && B_FPS=$(median "${b_fps[@]}") B2=$(median "${b2s[@]}")
if want cairn; then
	C_FPS=$(median "${c_fps[@]}") C1=$(median "${c1[@]}") C2=$(median "${c2[@]}")
	SPEEDUP=$(median "${speedups[@]}") JSP=$(median "${js2[@]}")
	fails=()
	if want restic; then
		VS_R=$(median "${vs_r[@]}") VS_R2=$(median "${vs_r2[@]}")
		ge "$VS_R" 1 || fails+=("first put slower than restic")
		ge "$VS_R2" 1 || fails+=("second put slower than restic's")
	fi
	if want borg; then
		VS_B=$(median "${vs_b[@]}") VS_B2=$(median "${vs_b2[@]}")
		ge "$VS_B" 1 || fails+=("first put slower than borg")
	fi
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
realm (the second over the unchanged tree), \`restic backup --repo REPO --json DIR\` twice into a
fresh repo, and \`borg create REPO::a DIR\` then \`REPO::b\` into a fresh repokey repo, each under
\`/usr/bin/time -v\`; wall clock of the whole process. "json s" is the \`seconds\` field of each
put's --json summary (time inside the command).

| run | cairn 1st s | cairn files/s | cairn 2nd s | 2nd new_chunks | 1st/2nd (wall) | json s 1st / 2nd | restic s | restic files/s | restic 2nd s | borg s | borg files/s | borg 2nd s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${rows[@]}")

Medians: cairn **$C_FPS files/s**, restic **$R_FPS files/s**, borg **$B_FPS files/s**; per-run ratio
cairn/restic **${VS_R}×**, cairn/borg **${VS_B}×** (acceptance ≥ 1 each). Cairn first put $C1 s,
second put $C2 s, speedup **${SPEEDUP}×** wall clock (acceptance ≥ ${MIN_SPEEDUP}×; by the --json
seconds: ${JSP}×); restic's second backup $R2 s, borg's $B2 s; per-run ratio of their second run to
cairn's: restic **${VS_R2}×** (acceptance ≥ 1), borg ${VS_B2}×; second put new_chunks == 0 in every
run: $( ((chunks_ok)) && echo yes || echo NO). **$verdict**
END
[[ $verdict != FAIL* ]]
