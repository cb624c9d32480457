#!/usr/bin/env bash
# Dedup between versions: golang.org/x/tools v0.27.0 then v0.28.0, staged at the same path,
# put into the same cairn path (home:/xtools) and backed up twice by restic.
# Reports the bytes each tool adds for the second version.
# Acceptance: cairn's stored bytes added by v0.28.0 < restic's (medians).
#   cairn:  `cairn stats --json` stored_bytes after minus before the second put
#           (the second put's --json new_bytes is shown beside it)
#   restic: `restic stats --mode raw-data --json` total_size after minus before the second
#           backup (packed, i.e. compressed blob bytes: what lands in the pack files). Debian's
#           restic 0.14 has no data_added_packed; its data_added (uncompressed, shown for
#           reference) and the repository's on-disk growth (du, includes index and snapshot
#           files) are reported too.
# Usage: [RUNS=3] bench/dedup-xtools.sh
source "$(dirname "$0")/lib.sh"

V1=v0.27.0 V2=v0.28.0
build_cairn

declare -A DIRS
xtools_dirs $V1 $V2

STAGE=$WORK/stage/xtools
stage() { # stage VERSION: make $STAGE exactly that version's tree, changing only what differs
	mkdir -p "$STAGE"
	rsync -a --checksum --delete "${DIRS[$1]}/" "$STAGE/"
}
stored() { CAIRN_HOME=$1 "$CAIRN" stats --json </dev/null | jq -r '.stored_bytes'; }
raw() { restic stats --repo "$1" --mode raw-data --json </dev/null | jq -r '.total_size'; }
dub() { du -sb "$1" | cut -f1; }

c_add=() c_new=() r_add=() rows=()
for i in $(seq 1 "$RUNS"); do
	realm=$WORK/realm-$i repo=$WORK/restic-$i
	want cairn && new_realm "$realm"
	want restic && new_restic_repo "$repo"
	cs1=- cd=- cn=- rs1=- rd=- rda=- rdu=-
	# v1 into both
	rm -rf "$STAGE"
	stage $V1
	if want cairn; then
		timed "$WORK/cairn-$i-1" env CAIRN_HOME="$realm" "$CAIRN" put --json "$STAGE" home:/
		cs1=$(stored "$realm")
	fi
	if want restic; then
		timed "$WORK/restic-$i-1" restic backup --repo "$repo" --json "$STAGE"
		rs1=$(raw "$repo") du1=$(dub "$repo")
	fi
	# v2 over it, in place
	stage $V2
	if want cairn; then
		timed "$WORK/cairn-$i-2" env CAIRN_HOME="$realm" "$CAIRN" put --json "$STAGE" home:/
		cd=$(($(stored "$realm") - cs1))
		cn=$(jq -r '.new_bytes' "$WORK/cairn-$i-2.out")
		c_add+=("$cd") c_new+=("$cn")
	fi
	if want restic; then
		timed "$WORK/restic-$i-2" restic backup --repo "$repo" --json "$STAGE"
		rd=$(($(raw "$repo") - rs1))
		rda=$(jq -r 'select(.message_type == "summary") | .data_added' "$WORK/restic-$i-2.out")
		rdu=$(($(dub "$repo") - du1))
		r_add+=("$rd")
	fi
	rows+=("| $i | $cs1 | $cd | $cn | $rs1 | $rd | $rda | $rdu |")
	echo "run $i: second version adds: cairn $cd B (new_bytes $cn); restic $rd B packed ($rda B data_added, $rdu B on disk)" >&2
	remove_realm "$realm"
	rm -rf "$repo"
done

C=- CN=- R=- verdict="no acceptance check (TOOLS=$TOOLS)"
want cairn && C=$(median "${c_add[@]}") && CN=$(median "${c_new[@]}")
want restic && R=$(median "${r_add[@]}")
if want cairn && want restic; then
	verdict=PASS
	lt "$C" "$R" || verdict=FAIL
fi
files=$(find "${DIRS[$V2]}" -type f | wc -l) bytes=$(find "${DIRS[$V2]}" -type f -printf '%s\n' | awk '{s += $1} END {print s}')

record "dedup between golang.org/x/tools $V1 and $V2" <<END
Inputs: \`go mod download -json golang.org/x/tools@$V1 golang.org/x/tools@$V2\` (private
GOMODCACHE); each tree is rsynced (--checksum --delete) in turn to the same staging path
\`.../stage/xtools\` ($V2: $files files, $bytes bytes). Per run, a fresh realm and repo:
\`cairn put --json STAGE home:/\` and \`restic backup --repo REPO --json STAGE\` for $V1, then
again for $V2. Bytes added by the second version: cairn = \`cairn stats --json\` stored_bytes delta
(put --json new_bytes beside it); restic = \`restic stats --mode raw-data --json\` total_size delta
(packed blob bytes; restic 0.14 has no data_added_packed), with the summary's data_added
(uncompressed) and the repository's du growth for reference.

| run | cairn stored after $V1 | cairn added by $V2 | cairn new_bytes | restic packed after $V1 | restic added by $V2 (packed) | restic data_added | restic du growth |
|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${rows[@]}")

Medians of bytes added by $V2: cairn **$C** (new_bytes $CN), restic **$R** packed. Acceptance: cairn < restic. **$verdict**
END
[[ $verdict != FAIL* ]]
