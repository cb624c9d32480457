#!/usr/bin/env bash
# Issue 5: cloud stores, measured against MinIO on loopback beside `rclone copy` to the
# same server in the same run.
#   1. one SIZE_MIB (1024) MiB incompressible file: `cairn put --store s3a FILE home:/` vs
#      `rclone copy FILE m:BUCKET/rclone/`, then `cairn get --no-cache home:/f DEST` (reads the
#      bucket past every local cache) vs `rclone copy m:BUCKET/rclone/f DEST`: MB/s, requests,
#      peak RSS.
#   2. 10,000 files of 4 KiB (100 dirs x 100, as ingest-small.sh): `cairn put --store s3a DIR
#      home:/` vs `rclone copy DIR m:BUCKET/small/`: time and PUT requests.
# Acceptance: cairn put and get of the large file at least as fast as rclone's (median of
# per-run ratios >= 1); cairn <= 1 PUT per 100 small files (median).
# Requests are counted by MinIO itself (its Prometheus metrics, per S3 API, before and after
# each command), the same way for both tools; cairn's own count (`cairn store ls --json`) is
# shown beside it.
# Usage: [RUNS=3] [SIZE_MIB=1024] [PHASES="large small"] bench/cloud.sh
TOOLS=${TOOLS:-cairn rclone}
source "$(dirname "$0")/lib.sh"

SIZE_MIB=${SIZE_MIB:-1024}
PHASES=${PHASES:-large small}
NDIRS=100 PERDIR=100 FILESIZE=4096
NFILES=$((NDIRS * PERDIR))
MAX_PUT_PER_FILE=0.01
phase() { [[ " $PHASES " == *" $1 "* ]]; }

for c in rclone curl; do
	command -v "$c" >/dev/null || die "missing $c: run scripts/test-deps.sh"
done
MINIO_VERSION=$(sed -n 's/^MINIO_VERSION=//p' "$REPO_ROOT/scripts/test-deps.sh")
MINIO=${XDG_CACHE_HOME:-$HOME/.cache}/cairn-test/minio-$MINIO_VERSION/minio
[[ -x $MINIO && -f $(dirname "$MINIO")/.installed ]] || die "MinIO $MINIO_VERSION is not installed: run scripts/test-deps.sh"

build_cairn

# ---- MinIO on 127.0.0.1, its data in the work dir, stopped by its PID on exit.
MINIO_PID=
stop_minio() {
	[[ -n $MINIO_PID ]] || return 0
	kill -TERM "$MINIO_PID" 2>/dev/null || true
	wait "$MINIO_PID" 2>/dev/null || true
	MINIO_PID=
}
trap 'stop_minio; cleanup' EXIT
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 30000))
		ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
	done
}
PORT=$(free_port)
KEY=bench$RANDOM$RANDOM SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -p "$WORK/minio"
MINIO_ROOT_USER=$KEY MINIO_ROOT_PASSWORD=$SECRET MINIO_BROWSER=off MINIO_UPDATE=off \
	MINIO_CALLHOME_ENABLE=off MINIO_PROMETHEUS_AUTH_TYPE=public \
	"$MINIO" server "$WORK/minio" --quiet --address "127.0.0.1:$PORT" \
	--console-address "127.0.0.1:$(free_port)" >"$WORK/minio.log" 2>&1 </dev/null &
MINIO_PID=$!
for _ in $(seq 100); do
	curl -fs "http://127.0.0.1:$PORT/minio/health/ready" >/dev/null && break
	kill -0 "$MINIO_PID" 2>/dev/null || { cat "$WORK/minio.log" >&2; die "MinIO exited"; }
	sleep 0.1
done
curl -fs "http://127.0.0.1:$PORT/minio/health/ready" >/dev/null || die "MinIO not ready on 127.0.0.1:$PORT"
MINIO_VER=$("$MINIO" --version 2>/dev/null | awk 'NR == 1 { print $3 }')

# rclone: configured by environment only (remote "m"), no config file.
export RCLONE_CONFIG=$WORK/rclone.conf RCLONE_CONFIG_M_TYPE=s3 RCLONE_CONFIG_M_PROVIDER=Minio \
	RCLONE_CONFIG_M_ENV_AUTH=false RCLONE_CONFIG_M_ACCESS_KEY_ID=$KEY \
	RCLONE_CONFIG_M_SECRET_ACCESS_KEY=$SECRET RCLONE_CONFIG_M_REGION=us-east-1 \
	RCLONE_CONFIG_M_ENDPOINT=http://127.0.0.1:$PORT
# rclone's AWS SDK would load a CA bundle named by AWS_CA_BUNDLE (and fails on it): plain
# HTTP on loopback needs none.
rclone() { env -u AWS_CA_BUNDLE rclone "$@"; }
RCLONE_VER=$(rclone version 2>/dev/null | awk 'NR == 1 { print $2 }')
# cairn: credentials from the standard AWS variables.
CAIRN_ENV=(AWS_ACCESS_KEY_ID="$KEY" AWS_SECRET_ACCESS_KEY="$SECRET" AWS_EC2_METADATA_DISABLED=true
	AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_CONFIG_FILE=/nonexistent)

# minio_reqs: MinIO's request counters (metrics v3, exact at once), one "API count" line per
# S3 API.
minio_reqs() {
	curl -fs "http://127.0.0.1:$PORT/minio/metrics/v3/api/requests" |
		awk '/^minio_api_requests_total\{/ && /type="s3"/ { match($0, /name="[^"]*"/); a = substr($0, RSTART + 6, RLENGTH - 7); n[a] += $NF }
			END { for (a in n) printf "%s %d\n", a, n[a] }'
}
# reqs_delta BEFORE AFTER: "PUT GET LIST HEAD OTHER" between two minio_reqs snapshots.
# PUT class: PutObject, PutObjectPart, NewMultipartUpload, CompleteMultipartUpload (each
# billed as a PUT); GET: GetObject; LIST: ListObjects*, ListMultipartUploads; HEAD:
# HeadObject, HeadBucket.
reqs_delta() {
	awk 'FNR == NR { b[$1] = $2; next } { d[$1] = $2 - b[$1] }
		END {
			for (a in d) {
				if (a ~ /^(PutObject|PutObjectPart|NewMultipartUpload|CompleteMultipartUpload)$/) p += d[a]
				else if (a == "GetObject") g += d[a]
				else if (a ~ /^List/) l += d[a]
				else if (a ~ /^Head/) h += d[a]
				else o += d[a]
			}
			printf "%d %d %d %d %d\n", p, g, l, h, o
		}' "$1" "$2"
}
snap() { { echo "_ 0"; minio_reqs; } >"$1" || die "reading MinIO metrics failed"; }
# minio_cpu: MinIO's CPU seconds so far (user + system, /proc/PID/stat); the timed
# commands share the machine with it, so each row shows what it spent serving them.
CLK_TCK=$(getconf CLK_TCK)
minio_cpu() { awk -v hz="$CLK_TCK" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$MINIO_PID/stat"; }
# cpu_row M0: "user/sys (+MinIO)" of the command timed last, MinIO's share since M0.
cpu_row() { printf '%s/%s (+%s)' "$T_USER" "$T_SYS" "$(calc "$(minio_cpu) - $1")"; }
# cairn_reqs REALM: cairn's own count for store s3a: "PUT GET LIST HEAD" so far.
cairn_reqs() {
	env CAIRN_HOME="$1" "${CAIRN_ENV[@]}" "$CAIRN" store ls --json </dev/null |
		jq -r '.[] | select(.name == "s3a") | .requests | "\(.PUT // 0) \(.GET // 0) \(.LIST // 0) \(.HEAD // 0)"'
}

# ---- Inputs.
if phase large; then
	BIG=$WORK/in/f
	mkdir -p "$WORK/in"
	cached=$CACHE/random-2048MiB.bin
	if ((SIZE_MIB <= 2048)) && [[ $(stat -c %s "$cached" 2>/dev/null || echo 0) == $((2048 * 1048576)) ]]; then
		head -c "$((SIZE_MIB * 1048576))" "$cached" >"$BIG"
	else
		head -c "$((SIZE_MIB * 1048576))" /dev/urandom >"$BIG"
	fi
	cat "$BIG" >/dev/null
	MB=$(calc "$SIZE_MIB * 1048576 / 1e6")
fi
if phase small; then
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
	SMALL=$WORK/small
	rsync -a --exclude=.complete "$TREE/" "$SMALL/"
	n=$(find "$SMALL" -type f | wc -l)
	((n == NFILES)) || die "$SMALL has $n files, want $NFILES"
	find "$SMALL" -type f -exec cat {} + >/dev/null
fi

# ---- Runs. Each: a fresh bucket, a fresh realm with the bucket added as store s3a.
# Order within a run: cairn put, rclone put, cairn get, rclone get, cairn small, rclone small.
declare -a put_r get_r c_put c_get r_put r_get c_rss r_rss c_sput c_sw r_sput r_sw c_ppf rows_l rows_s
for i in $(seq 1 "$RUNS"); do
	bucket=bench$i
	rclone mkdir "m:$bucket" </dev/null || die "rclone mkdir m:$bucket failed"
	realm=$WORK/realm-$i
	if want cairn; then
		new_realm "$realm"
		env CAIRN_HOME="$realm" "${CAIRN_ENV[@]}" "$CAIRN" store add s3a \
			"s3://$bucket/cairn?endpoint=127.0.0.1:$PORT&insecure=1" </dev/null >/dev/null ||
			die "cairn store add failed"
	fi
	if phase large; then
		cw=- cmb=- crss=- cdrss=- cq=- cown=- rw=- rmb=- rrss=- rq=- ccpu=- rcpu=-
		gw=- gmb=- grss=- gq=- gown=- sw=- smb=- srss=- sq=- gcpu=- scpu=-
		ld=$(cut -d' ' -f1 /proc/loadavg)
		if want cairn; then
			settle
			snap "$WORK/m0"
			o0=$(cairn_reqs "$realm")
			mc=$(minio_cpu)
			timed "$WORK/cairn-put-$i" env CAIRN_HOME="$realm" "${CAIRN_ENV[@]}" "$CAIRN" put --store s3a "$BIG" home:/
			cw=$T_WALL cmb=$(calc "$MB / $cw") crss=$T_RSS_MB cdrss=$(daemon_rss_mb "$realm") ccpu=$(cpu_row "$mc")
			snap "$WORK/m1"
			cq=$(reqs_delta "$WORK/m0" "$WORK/m1")
			o1=$(cairn_reqs "$realm")
			cown=$(paste -d' ' <(tr ' ' '\n' <<<"$o0") <(tr ' ' '\n' <<<"$o1") | awk '{ printf "%s%d", (NR > 1 ? "/" : ""), $2 - $1 }')
			c_put+=("$cmb") c_rss+=("$crss")
		fi
		if want rclone; then
			settle
			snap "$WORK/m0"
			mc=$(minio_cpu)
			timed "$WORK/rclone-put-$i" env -u AWS_CA_BUNDLE rclone copy "$BIG" "m:$bucket/rclone/"
			rw=$T_WALL rmb=$(calc "$MB / $rw") rrss=$T_RSS_MB rcpu=$(cpu_row "$mc")
			snap "$WORK/m1"
			rq=$(reqs_delta "$WORK/m0" "$WORK/m1")
			r_put+=("$rmb") r_rss+=("$rrss")
		fi
		[[ $cmb != - && $rmb != - ]] && put_r+=("$(calc "$cmb / $rmb")")
		if want cairn; then
			rm -rf "$WORK/get-c"
			mkdir -p "$WORK/get-c"
			settle
			snap "$WORK/m0"
			o0=$(cairn_reqs "$realm")
			mc=$(minio_cpu)
			timed "$WORK/cairn-get-$i" env CAIRN_HOME="$realm" "${CAIRN_ENV[@]}" "$CAIRN" get --no-cache home:/f "$WORK/get-c/f"
			gw=$T_WALL gmb=$(calc "$MB / $gw") grss=$T_RSS_MB gcpu=$(cpu_row "$mc")
			snap "$WORK/m1"
			gq=$(reqs_delta "$WORK/m0" "$WORK/m1")
			o1=$(cairn_reqs "$realm")
			gown=$(paste -d' ' <(tr ' ' '\n' <<<"$o0") <(tr ' ' '\n' <<<"$o1") | awk '{ printf "%s%d", (NR > 1 ? "/" : ""), $2 - $1 }')
			cmp -s "$BIG" "$WORK/get-c/f" || die "cairn get: the file read back differs"
			rm -rf "$WORK/get-c"
			c_get+=("$gmb") c_rss+=("$grss")
		fi
		if want rclone; then
			rm -rf "$WORK/get-r"
			mkdir -p "$WORK/get-r"
			settle
			snap "$WORK/m0"
			mc=$(minio_cpu)
			timed "$WORK/rclone-get-$i" env -u AWS_CA_BUNDLE rclone copy "m:$bucket/rclone/f" "$WORK/get-r/"
			sw=$T_WALL smb=$(calc "$MB / $sw") srss=$T_RSS_MB scpu=$(cpu_row "$mc")
			snap "$WORK/m1"
			sq=$(reqs_delta "$WORK/m0" "$WORK/m1")
			cmp -s "$BIG" "$WORK/get-r/f" || die "rclone copy: the file read back differs"
			rm -rf "$WORK/get-r"
			r_get+=("$smb") r_rss+=("$srss")
		fi
		[[ $gmb != - && $smb != - ]] && get_r+=("$(calc "$gmb / $smb")")
		rows_l+=("| $i (load $ld) | put | $cw | $cmb | $crss (+$cdrss daemon) | $ccpu | ${cq// //} | $cown | $rw | $rmb | $rrss | $rcpu | ${rq// //} |")
		rows_l+=("| $i | get | $gw | $gmb | $grss | $gcpu | ${gq// //} | $gown | $sw | $smb | $srss | $scpu | ${sq// //} |")
		echo "run $i: put cairn ${cw}s ($cmb MB/s) rclone ${rw}s ($rmb MB/s); get cairn ${gw}s ($gmb MB/s) rclone ${sw}s ($smb MB/s)" >&2
	fi
	if phase small; then
		kw=- kfps=- kq=- kown=- kppf=- lw=- lfps=- lq=- lppf=-
		if want cairn; then
			settle
			snap "$WORK/m0"
			o0=$(cairn_reqs "$realm")
			timed "$WORK/cairn-small-$i" env CAIRN_HOME="$realm" "${CAIRN_ENV[@]}" "$CAIRN" put --json --store s3a "$SMALL" home:/
			kw=$T_WALL kfps=$(calc "$NFILES / $kw")
			snap "$WORK/m1"
			kq=$(reqs_delta "$WORK/m0" "$WORK/m1")
			o1=$(cairn_reqs "$realm")
			kown=$(paste -d' ' <(tr ' ' '\n' <<<"$o0") <(tr ' ' '\n' <<<"$o1") | awk '{ printf "%s%d", (NR > 1 ? "/" : ""), $2 - $1 }')
			files=$(jq -r .files "$WORK/cairn-small-$i.out")
			[[ $files == "$NFILES" ]] || die "cairn put stored $files files, want $NFILES"
			kppf=$(calc "${kq%% *} / $NFILES")
			c_sw+=("$kw") c_sput+=("${kq%% *}") c_ppf+=("$kppf")
		fi
		if want rclone; then
			settle
			snap "$WORK/m0"
			timed "$WORK/rclone-small-$i" env -u AWS_CA_BUNDLE rclone copy "$SMALL" "m:$bucket/small/"
			lw=$T_WALL lfps=$(calc "$NFILES / $lw")
			snap "$WORK/m1"
			lq=$(reqs_delta "$WORK/m0" "$WORK/m1")
			lppf=$(calc "${lq%% *} / $NFILES")
			r_sw+=("$lw") r_sput+=("${lq%% *}")
		fi
		rows_s+=("| $i | $kw | $kfps | ${kq// //} | $kown | $kppf | $lw | $lfps | ${lq// //} | $lppf |")
		echo "run $i: small cairn ${kw}s (${kq%% *} PUTs) rclone ${lw}s (${lq%% *} PUTs)" >&2
	fi
	want cairn && remove_realm "$realm"
	rclone purge "m:$bucket" </dev/null || echo "warning: rclone purge m:$bucket failed" >&2
done

# ---- Verdicts.
med() { if (($#)); then median "$@"; else echo -; fi; }
fails=() checks=()
verdict_of() { if [[ $2 == - ]]; then echo "not measured"; elif eval "$1"; then echo PASS; else echo FAIL; fi; }
if phase large; then
	PR=$(med "${put_r[@]}") GR=$(med "${get_r[@]}")
	v1=$(verdict_of 'ge "$PR" 1' "$PR") v2=$(verdict_of 'ge "$GR" 1' "$GR")
	[[ $v1 == FAIL ]] && fails+=("put")
	[[ $v2 == FAIL ]] && fails+=("get")
	checks+=("| ${SIZE_MIB} MiB put, cairn MB/s ÷ rclone MB/s | cairn $(med "${c_put[@]}") MB/s, rclone $(med "${r_put[@]}") MB/s: **${PR}×** | ≥ 1 | **$v1** |")
	checks+=("| ${SIZE_MIB} MiB get (--no-cache), cairn ÷ rclone | cairn $(med "${c_get[@]}") MB/s, rclone $(med "${r_get[@]}") MB/s: **${GR}×** | ≥ 1 | **$v2** |")
	checks+=("| peak RSS (max over runs, put and get) | cairn $(printf '%s\n' "${c_rss[@]:--}" | sort -g | tail -1) MB, rclone $(printf '%s\n' "${r_rss[@]:--}" | sort -g | tail -1) MB | reported | — |")
fi
if phase small; then
	PPF=$(med "${c_ppf[@]}")
	v3=$(verdict_of 'awk -v a="$PPF" -v b="$MAX_PUT_PER_FILE" "BEGIN { exit !(a <= b) }"' "$PPF")
	[[ $v3 == FAIL ]] && fails+=("small-file PUTs")
	checks+=("| $NFILES × $FILESIZE B files: PUT requests per file (cairn) | cairn $(med "${c_sput[@]}") PUTs (**$PPF**/file) in $(med "${c_sw[@]}") s; rclone $(med "${r_sput[@]}") PUTs in $(med "${r_sw[@]}") s | ≤ $MAX_PUT_PER_FILE | **$v3** |")
fi
if ! want cairn || ! want rclone; then
	verdict="no acceptance check (TOOLS=$TOOLS)"
elif ((${#fails[@]})); then
	verdict="FAIL ($(IFS=,; echo "${fails[*]}" | sed "s/,/, /g"))"
else
	verdict=PASS
fi

body="Per run: a fresh bucket on one MinIO ($MINIO_VER, \`server\` on 127.0.0.1, data in the work dir on
the same disk) and a fresh realm (\`cairn init --no-passphrase\`, \`cairn store add s3a
's3://BUCKET/cairn?endpoint=127.0.0.1:PORT&insecure=1'\`, keys from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY);
rclone $RCLONE_VER configured by environment only (remote \`m\`: type s3, provider Minio, its defaults:
4 transfers, multipart above 200 MiB in 5 MiB parts 4 at a time, multi-thread download above 250 MiB).
Each command under \`/usr/bin/time -v\`, wall clock of the whole process, \`sync; sleep ${SETTLE:-3}\` before it;
its CPU seconds user/sys from \`time -v\`, and in parentheses MinIO's own CPU seconds meanwhile (/proc/PID/stat).
Requests are MinIO's own counts (\`minio_api_requests_total\` of its metrics v3, per S3 API, before and after the
command) as PUT/GET/LIST/HEAD/other, PUT = PutObject + PutObjectPart + New/CompleteMultipartUpload;
\"cairn's count\" is the delta of \`cairn store ls --json\` requests PUT/GET/LIST/HEAD around the command
(it includes the LIST that opening the store for \`store ls\` itself makes)."
if phase large; then
	body+="

### ${SIZE_MIB} MiB incompressible file

\`cairn put --store s3a FILE home:/\` vs \`rclone copy FILE m:BUCKET/rclone/\`; then \`cairn get --no-cache
home:/f DEST\` vs \`rclone copy m:BUCKET/rclone/f DESTDIR/\` (both compared with the source afterwards, untimed).

| run | op | cairn s | cairn MB/s | cairn peak RSS MB | cairn CPU s user/sys (+MinIO) | cairn reqs (MinIO) P/G/L/H/o | cairn's count P/G/L/H | rclone s | rclone MB/s | rclone peak RSS MB | rclone CPU s user/sys (+MinIO) | rclone reqs (MinIO) P/G/L/H/o |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${rows_l[@]}")"
fi
if phase small; then
	body+="

### $NFILES files of $FILESIZE B

\`cairn put --json --store s3a DIR home:/\` vs \`rclone copy DIR m:BUCKET/small/\` (same realm and bucket as above).

| run | cairn s | cairn files/s | cairn reqs (MinIO) P/G/L/H/o | cairn's count P/G/L/H | cairn PUTs/file | rclone s | rclone files/s | rclone reqs (MinIO) P/G/L/H/o | rclone PUTs/file |
|---|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${rows_s[@]}")"
fi
body+="

| acceptance (issue 5) | measured (medians of $RUNS runs; ratios: median of per-run ratios) | target | verdict |
|---|---|---|---|
$(printf '%s\n' "${checks[@]}")

Overall: **$verdict**"

record "Issue 5: cloud stores (MinIO on loopback)" <<<"$body"
[[ $verdict != FAIL* ]]
