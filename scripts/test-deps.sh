#!/usr/bin/env bash
# Install what cairn's test suite and bench/ harnesses need on a fresh Debian 12 machine.
# Idempotent: apt-get runs only when a package is missing, so a second run takes ~1 s.
# Go modules are cached by Go itself (GOMODCACHE); `go mod download` warms that cache.
set -euo pipefail

# Debian packages: restic/rsync are peers the benchmarks compare against, fuse3 gives
# fusermount3 for mount tests, time gives /usr/bin/time -v (peak RSS), jq reads
# the --json output of cairn and restic in bench/, iproute2 gives ip(8) for the
# network-namespace hosts of internal/netnstest.
PKGS=(restic rsync fuse3 time jq iproute2)

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
