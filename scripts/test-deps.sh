#!/usr/bin/env bash
# Install what cairn's test suite and bench/ harnesses need on a fresh Debian 12 machine.
# Idempotent: apt-get runs only when a package is missing, so a second run takes ~1 s.
# Go modules are cached by Go itself (GOMODCACHE); `go mod download` warms that cache.
set -euo pipefail

# Debian packages: restic/rsync/rclone are peers the benchmarks compare against (rclone:
# bench/cloud.sh, to MinIO), fuse3 gives
# fusermount3 for mount tests, time gives /usr/bin/time -v (peak RSS), jq reads
# the --json output of cairn and restic in bench/, iproute2 gives ip(8) for the
# network-namespace hosts of internal/netnstest, git and sqlite3 are real programs
# the mount tests run on a mount (internal/mount/programs_test.go; vim and ed too
# when present, not required).
PKGS=(restic rsync rclone fuse3 time jq iproute2 git sqlite3)

missing=()
for p in "${PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
		missing+=("$p")
	fi
done

if ((${#missing[@]})); then
	echo "test-deps: installing Debian packages: ${missing[*]}"
	SUDO=()
	if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo); fi
	export DEBIAN_FRONTEND=noninteractive
	# Try with the current package lists first; refresh them only if that fails.
	if ! "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null; then
		echo "test-deps: apt-get update, then retry"
		"${SUDO[@]}" apt-get update -q </dev/null
		"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
	fi
else
	echo "test-deps: Debian packages present: ${PKGS[*]}"
fi

# Go module cache: downloads only what is not cached yet.
if [[ -f go.mod ]] && command -v go >/dev/null; then
	if go mod download 2>&1; then
		echo "test-deps: Go modules cached in $(go env GOMODCACHE)"
	else
		echo "test-deps: go mod download failed" >&2
		exit 1
	fi
fi

# --- Cloud object-store test servers (internal/store/cloudtest) -------------------------
# MinIO (S3), fake-gcs-server (GCS) and Azurite (Azure Blob), used only as servers that
# the s3store, gcsstore and azstore tests start on 127.0.0.1; never linked into cairn.
# Each goes in its own directory under the cache, keyed by version, and is marked done
# by a .installed file written last, so an interrupted install is redone and a second
# run costs nothing. internal/store/cloudtest looks for them at the same paths; bump a
# version there and here together.
CLOUD_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/cairn-test"
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
FAKEGCS_VERSION=v1.56.1
AZURITE_VERSION=3.37.0

cloud_install() { # cloud_install NAME DIR COMMAND...
	local name=$1 dir=$2
	shift 2
	mkdir -p "$CLOUD_CACHE"
	# One installer at a time per server (two test runs may start together).
	exec 9>"$dir.lock"
	flock 9
	if [[ -f $dir/.installed ]]; then
		echo "test-deps: $name present in $dir"
		exec 9>&-
		return 0
	fi
	echo "test-deps: installing $name into $dir"
	local t0=$SECONDS
	rm -rf "$dir"
	mkdir -p "$dir"
	if ! "$@"; then
		echo "test-deps: installing $name failed" >&2
		exec 9>&-
		return 1
	fi
	touch "$dir/.installed"
	exec 9>&-
	echo "test-deps: $name installed in $((SECONDS - t0)) s"
}

if command -v go >/dev/null; then
	# Outside the module, so cairn's go.mod neither constrains nor records them.
	cloud_install "MinIO $MINIO_VERSION" "$CLOUD_CACHE/minio-$MINIO_VERSION" \
		env -C / GOBIN="$CLOUD_CACHE/minio-$MINIO_VERSION" GOFLAGS=-mod=mod \
		go install "github.com/minio/minio@$MINIO_VERSION"
	cloud_install "fake-gcs-server $FAKEGCS_VERSION" "$CLOUD_CACHE/fake-gcs-server-$FAKEGCS_VERSION" \
		env -C / GOBIN="$CLOUD_CACHE/fake-gcs-server-$FAKEGCS_VERSION" GOFLAGS=-mod=mod \
		go install "github.com/fsouza/fake-gcs-server@$FAKEGCS_VERSION"
else
	echo "test-deps: no go on PATH: cannot install MinIO and fake-gcs-server" >&2
	exit 1
fi
if command -v npm >/dev/null; then
	cloud_install "Azurite $AZURITE_VERSION" "$CLOUD_CACHE/azurite-$AZURITE_VERSION" \
		npm install --silent --no-audit --no-fund --prefix "$CLOUD_CACHE/azurite-$AZURITE_VERSION" "azurite@$AZURITE_VERSION"
else
	echo "test-deps: no npm on PATH (Debian: nodejs npm): cannot install Azurite" >&2
	exit 1
fi
# --- end of cloud object-store test servers --------------------------------------------

# --- WebDAV gateway (internal/dav, internal/cli: cairn dav) -----------------------------
# litmus is the WebDAV conformance suite TestLitmus runs against the gateway (basic,
# copymove, props, locks, http); davfs2 mounts it in TestDavfs2 (root only). Same
# pattern as the packages above: apt-get only when one is missing.
DAV_PKGS=(litmus davfs2)
dav_missing=()
for p in "${DAV_PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
		dav_missing+=("$p")
	fi
done
if ((${#dav_missing[@]})); then
	echo "test-deps: installing Debian packages: ${dav_missing[*]}"
	SUDO=()
	if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo); fi
	export DEBIAN_FRONTEND=noninteractive
	if ! "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${dav_missing[@]}" </dev/null; then
		echo "test-deps: apt-get update, then retry"
		"${SUDO[@]}" apt-get update -q </dev/null
		"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${dav_missing[@]}" </dev/null
	fi
else
	echo "test-deps: Debian packages present: ${DAV_PKGS[*]}"
fi
# --- end of WebDAV gateway --------------------------------------------------------------

# --- vet's shadow analyzer (scripts/test.sh: go vet -vettool) ---------------------------
# Not part of the go command; built once into the cache like the servers above.
SHADOW_VERSION=v0.52.0
cloud_install "shadow (golang.org/x/tools $SHADOW_VERSION)" "$CLOUD_CACHE/shadow-$SHADOW_VERSION" \
	env -C / GOBIN="$CLOUD_CACHE/shadow-$SHADOW_VERSION" GOFLAGS=-mod=mod \
	go install "golang.org/x/tools/go/analysis/passes/shadow/cmd/shadow@$SHADOW_VERSION"
# --- end of shadow ----------------------------------------------------------------------
