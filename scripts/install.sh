#!/usr/bin/env bash
# Install cairn on a Debian machine and run a first real job on the embedded
# defaults: init a throw-away realm, put a directory, list it, get it back and
# compare. Usage: scripts/install.sh [--no-demo]
# It installs into /usr/local/bin as root, else ~/.local/bin; CAIRN_BINDIR
# chooses another directory.
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
say() { echo "install: $*"; }
sudo=""
[[ $(id -u) -eq 0 ]] || sudo=sudo

say "checking for Go ≥ 1.21"
if need_go; then
	say "installing Go from Debian (apt-get update, then apt-get install golang-go)..."
	$sudo apt-get update -qq
	$sudo apt-get install -y -qq golang-go >/dev/null
	if need_go; then
		echo "install: Debian's Go ($(go env GOVERSION)) is older than 1.21; install Go ≥ 1.21 (e.g. from bookworm-backports) and run again" >&2
		exit 1
	fi
fi

# 'cairn mount' needs FUSE 3 (fusermount3); everything else works without.
say "checking for FUSE 3 (needed by 'cairn mount' only)"
if ! command -v fusermount3 >/dev/null 2>&1; then
	if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		answer=y
		if [[ -t 0 ]]; then
			read -r -p "install: fusermount3 is missing: install the Debian package fuse3 now? [Y/n] " answer || answer=n
		fi
		if [[ ${answer:-y} =~ ^[Yy]|^$ ]]; then
			say "installing fuse3 (apt-get install fuse3)..."
			apt-get install -y -qq fuse3 >/dev/null || { apt-get update -qq && apt-get install -y -qq fuse3 >/dev/null; } ||
				say "could not install fuse3: 'cairn mount' will not work until it is installed"
		else
			say "skipped: install fuse3 before using 'cairn mount' (apt-get install fuse3)"
		fi
	else
		say "fusermount3 is missing: 'cairn mount' needs it (on Debian: sudo apt-get install fuse3)"
	fi
fi

bindir=/usr/local/bin
[[ $(id -u) -eq 0 ]] || bindir="$HOME/.local/bin"
bindir=${CAIRN_BINDIR:-$bindir}
mkdir -p "$bindir"
# Go may first fetch the toolchain go.mod asks for, then the modules: on a
# fresh machine the two take minutes, so say so.
say "fetching the Go toolchain go.mod asks for, if this Go is older (once)..."
gover=$(GOTOOLCHAIN=auto go env GOVERSION)
say "downloading the Go modules cairn needs (first time: a few minutes)..."
GOTOOLCHAIN=auto go mod download
version=$(git describe --tags --always --dirty 2>/dev/null || true)
say "compiling cairn ${version:+$version }with $gover (first time: a few minutes)..."
GOTOOLCHAIN=auto go build -trimpath ${version:+-ldflags "-X cairn.dev/cairn/internal/cli.version=$version"} -o "$bindir/cairn" ./cmd/cairn
say "installed $bindir/cairn ($("$bindir/cairn" --version))"
case ":$PATH:" in *":$bindir:"*) ;; *) echo "install: add $bindir to your PATH" ;; esac
# Manual pages and bash completion, from the binary's own help text.
if [[ $(id -u) -eq 0 && -z ${CAIRN_BINDIR:-} ]]; then
	mandir=/usr/local/share/man/man1 compdir=/usr/share/bash-completion/completions
else
	mandir=${XDG_DATA_HOME:-$HOME/.local/share}/man/man1 compdir=${XDG_DATA_HOME:-$HOME/.local/share}/bash-completion/completions
fi
"$bindir/cairn" man "$mandir" >/dev/null && say "installed the manual pages in $mandir ('man cairn', 'man cairn-put')"
mkdir -p "$compdir" && "$bindir/cairn" completion bash >"$compdir/cairn" && say "installed bash completion in $compdir/cairn (new shells; zsh and fish: 'cairn completion --help')"
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
