#!/usr/bin/env bash
# Issue 14: the corruption drill. A fresh realm holds FILES (30) files of incompressible
# bytes (fixed SEED), each put by its own `cairn put`, so that each put's pack holds that
# file's chunks and, last, its manifest. One byte is flipped in each of FLIPS (20) chunk
# records chosen at random (SEED) among all the packs, as a failing disk would. Then:
#   1. `cairn fsck --read-data --repair` without the files must exit 5 and name as
#      UNREADABLE exactly the files whose chunks were flipped (known from the packs);
#   2. `cairn fsck --read-data --repair --source SRC` must exit 0, and every file must
#      read back (`cairn get`) byte-identical, and a last `fsck --read-data` find nothing.
# A check, not a benchmark: it prints what it did and exits 1 when a check fails (2 when
# the harness cannot run); it records nothing in RESULTS.md.
# Usage: [SEED=14] [FILES=30] [FLIPS=20] bench/corruption-drill.sh
TOOLS=cairn
source "$(dirname "$0")/lib.sh"

SEED=${SEED:-14}
FILES=${FILES:-30}
FLIPS=${FLIPS:-20}
RANDOM=$SEED
command -v openssl >/dev/null || die "missing openssl"

build_cairn
R=$WORK/realm
new_realm "$R"
cn() { CAIRN_HOME=$R "$CAIRN" "$@" </dev/null; }
SRC=$WORK/files
mkdir -p "$SRC" "$WORK/out"
PACKS=$R/store/packs

# ---- The files, each put on its own, and the packs each put made.
declare -A FILE_OF # pack -> file name
for i in $(seq -f '%02g' 1 "$FILES"); do
	name=f$i
	size=$((20000 + RANDOM * 3))
	head -c "$size" /dev/zero |
		openssl enc -aes-128-ctr -nosalt -K "$(printf '%032x' $((SEED * 1000 + 10#$i)))" -iv 00000000000000000000000000000000 >"$SRC/$name"
	before=$(ls "$PACKS" 2>/dev/null | sort)
	cn put "$SRC/$name" home:/ >"$WORK/put.log" 2>&1 || { cat "$WORK/put.log" >&2; die "cairn put failed"; }
	for p in $(comm -13 <(echo "$before") <(ls "$PACKS" | sort)); do
		[[ $p == *.pack ]] && FILE_OF[$PACKS/$p]=$name
	done
done

# ---- Chunk records: every data record of each put's pack but the last (the manifest).
# Record: "crec", kind (1 = data), 3 zero bytes, payload length (4 bytes LE), ID, CRC; 48
# bytes, then the payload (doc/format.md, "Local store").
RECS=() # "pack payload-offset length"
for p in "${!FILE_OF[@]}"; do
	size=$(stat -c %s "$p")
	off=32
	last=
	while ((off + 48 <= size)); do
		# shellcheck disable=SC2207
		h=($(od -A n -t x1 -v -j "$off" -N 12 "$p"))
		[[ ${h[0]}${h[1]}${h[2]}${h[3]} == 63726563 ]] || break # "crec"
		len=$((16#${h[11]}${h[10]}${h[9]}${h[8]}))
		if [[ ${h[4]} == 01 ]]; then
			[[ -n $last ]] && RECS+=("$last")
			last="$p $((off + 48)) $len"
		fi
		off=$((off + 48 + len))
	done
done
((${#RECS[@]} >= FLIPS)) || die "only ${#RECS[@]} chunk records, want at least $FLIPS"

# ---- Flip one byte in each of FLIPS random chunk records.
declare -A EXPECT
for ((k = 0; k < FLIPS; k++)); do
	j=$((k + RANDOM % (${#RECS[@]} - k))) # a partial Fisher-Yates shuffle
	t=${RECS[k]}
	RECS[k]=${RECS[j]}
	RECS[j]=$t
	read -r p poff len <<<"${RECS[k]}"
	at=$((poff + RANDOM % len))
	b=$(od -A n -t u1 -j "$at" -N 1 "$p" | tr -d ' ')
	printf "\\x$(printf '%02x' $((b ^ 0x01)))" | dd of="$p" bs=1 seek="$at" conv=notrunc status=none
	EXPECT[home:/${FILE_OF[$p]}]=1
done
expected=$(printf '%s\n' "${!EXPECT[@]}" | sort)
echo "$FILES files, ${#RECS[@]} chunk records; flipped a byte in $FLIPS of them, damaging $(echo "$expected" | wc -l) files" >&2

fail=0
check() { # check WHAT OK
	if [[ $2 == 1 ]]; then echo "ok:   $1"; else echo "FAIL: $1"; fail=1; fi
}

# ---- 1. Without the files: exactly the damaged files are named, exit 5.
rc=0
cn fsck --read-data --repair >"$WORK/fsck1.out" 2>"$WORK/fsck1.err" || rc=$?
named=$(awk '$1 == "UNREADABLE" { print $2 }' "$WORK/fsck1.out" | sort -u)
check "fsck --repair without sources exits 5 (got $rc)" "$((rc == 5))"
if [[ $named == "$expected" ]]; then same=1; else same=0; fi
check "it names exactly the $(echo "$expected" | wc -l) damaged files" "$same"
((same)) || diff <(echo "$expected") <(echo "$named") | sed 's/^/  /'

# ---- 2. With the files: everything heals.
rc=0
start=$(date +%s.%N)
cn fsck --read-data --repair --source "$SRC" >"$WORK/fsck2.out" 2>"$WORK/fsck2.err" || rc=$?
secs=$(echo "$(date +%s.%N) - $start" | bc)
check "fsck --repair --source exits 0 (got $rc, ${secs}s)" "$((rc == 0))"
grep -E '^(UNREADABLE|[0-9]+ damaged)' "$WORK/fsck2.out" | sed 's/^/  /' || true
bad=0
for f in "$SRC"/*; do
	name=$(basename "$f")
	if ! cn get "home:/$name" "$WORK/out/$name" 2>/dev/null || ! cmp -s "$f" "$WORK/out/$name"; then
		echo "  $name does not read back byte-identical"
		bad=$((bad + 1))
	fi
done
check "every file reads back byte-identical ($bad differ)" "$((bad == 0))"
rc=0
cn fsck --read-data >"$WORK/fsck3.out" 2>&1 || rc=$?
check "a last fsck --read-data finds nothing (exit $rc)" "$((rc == 0))"
exit $fail
