#!/usr/bin/env bash
# Install cairn on a Debian machine and run a first real job on the embedded
# defaults: init a throw-away realm, put a directory, list it, get it back and
# compare. Usage: scripts/install.sh [--no-demo]
set -euo pipefail
cd "$(dirname "$0")/.."

need_go() {
	command -v go >/dev/null 2>&1 || return 0
	# Go ≥ 1.21 fetches the toolchain go.mod asks for (GOTOOLCHAIN=auto).
	local v
	v=$(go env GOVERSION 2>/dev/null | sed -E 's/^go([0-9]+)\.([0-9]+).*/\1 \2/')
	read -r major minor <<<"$v"
	[[ ${major:-0} -gt 1 || ${minor:-0} -ge 21 ]] && return 1
	return 0
}
if need_go; then
	echo "install: installing Go from Debian"
	sudo=""
	[[ $(id -u) -eq 0 ]] || sudo=sudo
	$sudo apt-get update -qq
	$sudo apt-get install -y -qq golang-go >/dev/null
	if need_go; then
		echo "install: Debian's Go ($(go env GOVERSION)) is older than 1.21; install Go ≥ 1.21 (e.g. from bookworm-backports) and run again" >&2
		exit 1
	fi
fi

bindir=/usr/local/bin
[[ $(id -u) -eq 0 ]] || bindir="$HOME/.local/bin"
mkdir -p "$bindir"
echo "install: building cairn ($(GOTOOLCHAIN=auto go env GOVERSION))"
GOTOOLCHAIN=auto go build -trimpath -o "$bindir/cairn" ./cmd/cairn
echo "install: installed $bindir/cairn"
case ":$PATH:" in *":$bindir:"*) ;; *) echo "install: add $bindir to your PATH" ;; esac
[[ ${1:-} == --no-demo ]] && exit 0

demo=$(mktemp -d)
# The demo's metadata service stops 1 s after the last command; then the
# demo realm is removed.
trap 'sleep 2; rm -rf "$demo"' EXIT
export CAIRN_HOME=$demo/realm CAIRN_ETCD_LINGER=1s
mkdir -p "$demo/src/docs"
cp -r doc README.md "$demo/src/docs/"
head -c 8388608 /dev/urandom >"$demo/src/random.bin"
echo "== cairn init --no-passphrase   (demo realm in $CAIRN_HOME)"
"$bindir/cairn" init --no-passphrase
echo "== cairn put $demo/src home:/"
"$bindir/cairn" put "$demo/src" home:/
echo "== cairn ls -l home:/src"
"$bindir/cairn" ls -l home:/src
echo "== cairn get home:/src $demo/back"
"$bindir/cairn" get home:/src "$demo/back"
diff -r "$demo/src" "$demo/back" && echo "== the copy matches the original"
"$bindir/cairn" stats
echo
echo "cairn works. Create your own realm with 'cairn init' (it will ask for a passphrase)."
