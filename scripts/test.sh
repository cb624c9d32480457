#!/usr/bin/env bash
# The whole cairn test suite: the one command the README documents and .ci/run calls.
#
#   scripts/test.sh
#
# Steps: install what the tests need (scripts/test-deps.sh: cached, ~0.1 s when all is
# there), gofmt check, go vet, go test, go test -race, then a short fuzz pass over every
# `func FuzzXxx` found in the repository (new targets are picked up automatically).
# Environment knobs:
#   FUZZTIME      per-target fuzz time (default 10s; 0 skips fuzzing)
#   TEST_TIMEOUT  go test -timeout (default 30m)
#   RACE          1 (default) also runs the suite with -race, 0 skips that pass
set -uo pipefail
cd "$(dirname "$0")/.."
export CAIRN_REQUIRE_CLOUD_SERVERS=1 # cloud store tests fail, not skip, without MinIO/fake-gcs-server/Azurite (test-deps.sh installs them)
scripts/test-deps.sh </dev/null || { echo "test.sh: installing test dependencies failed"; exit 1; }

FUZZTIME=${FUZZTIME:-10s}
TEST_TIMEOUT=${TEST_TIMEOUT:-30m}
RACE=${RACE:-1}

declare -a SUMMARY=()
FAILED=0
T_START=$(date +%s)
step() { # step NAME RC SECONDS
	local status=ok
	if [[ $2 -ne 0 ]]; then status="FAIL (exit $2)"; FAILED=1; fi
	SUMMARY+=("$(printf '%-52s %-14s %5ss' "$1" "$status" "$3")")
}
now() { date +%s; }

echo "== gofmt"
t0=$(now)
# Every .go file git knows about or that is new and not ignored.
mapfile -t gofiles < <(git ls-files --cached --others --exclude-standard -- '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*')
unformatted=""
if ((${#gofiles[@]})); then
	unformatted=$(gofmt -l "${gofiles[@]}" 2>&1)
fi
if [[ -n $unformatted ]]; then
	echo "gofmt: these files need 'gofmt -w':"
	printf '  %s\n' $unformatted
	step "gofmt" 1 $(($(now) - t0))
else
	echo "gofmt: ${#gofiles[@]} files ok"
	step "gofmt" 0 $(($(now) - t0))
fi

echo "== go vet ./..."
t0=$(now)
go vet ./...
step "go vet ./..." $? $(($(now) - t0))

# Two passes. Without -race first: fast, and it runs at production timing — on commit
# 23c39b1 TestTwoCommandsAtOnce failed 3 times out of 3 without -race and passed under it
# (the race detector's slowdown hid a start-up race between two processes). Then with
# -race. Measured on 2 cores at c337d62 (14 packages): go test ./... 46 s, go test -race
# ./... 301 s (internal/cli 27 s -> 296 s); whole CI ~6 min of the 90-minute budget, so
# every package runs with -race. Re-measure when the suite grows; if -race stops fitting,
# restrict it to the concurrent packages here and say why. RACE=0 skips the -race pass.
echo "== go test -count=1 -timeout $TEST_TIMEOUT ./..."
t0=$(now)
go test -count=1 -timeout "$TEST_TIMEOUT" ./...
step "go test ./..." $? $(($(now) - t0))

if [[ $RACE == 1 ]]; then
	echo "== go test -race -count=1 -timeout $TEST_TIMEOUT ./..."
	t0=$(now)
	go test -race -count=1 -timeout "$TEST_TIMEOUT" ./...
	step "go test -race ./..." $? $(($(now) - t0))
fi

# Fuzz: go test -fuzz takes one target in one package at a time.
if [[ $FUZZTIME != 0 ]]; then
	mapfile -t fuzzfiles < <(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' . 2>/dev/null | grep -v '/\.git/' | sort)
	nfuzz=0
	for f in "${fuzzfiles[@]}"; do
		pkg="./$(dirname "${f#./}")"
		while read -r name; do
			[[ -n $name ]] || continue
			nfuzz=$((nfuzz + 1))
			echo "== fuzz $pkg $name ($FUZZTIME)"
			t0=$(now)
			out=$(mktemp)
			go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1 | tee "$out"
			rc=${PIPESTATUS[0]}
			# Go's fuzzing coordinator sometimes ends a run at -fuzztime with
			# "context deadline exceeded" and no crasher (seen on a loaded
			# 2-core machine, FuzzReadGetEntry): that is not a finding, so the
			# target runs once more. A real finding writes testdata/fuzz/NAME/*.
			if ((rc != 0)) && grep -q 'context deadline exceeded' "$out" &&
				[[ -z $(git status --porcelain -- "$pkg/testdata/fuzz/$name" 2>/dev/null) ]]; then
				echo "== fuzz $pkg $name: coordinator timed out without a finding; running it again"
				go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg"
				rc=$?
			fi
			rm -f "$out"
			step "fuzz $pkg $name" $rc $(($(now) - t0))
		done < <(grep -oE '^func Fuzz[A-Za-z0-9_]*\(' "$f" | sed -E 's/^func (Fuzz[A-Za-z0-9_]*)\(/\1/')
	done
	if ((nfuzz == 0)); then
		echo "== fuzz: no Fuzz targets found"
		SUMMARY+=("fuzz: no targets found")
	fi
fi

echo
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
echo "total $(($(date +%s) - T_START))s"
if ((FAILED)); then
	echo "scripts/test.sh: FAIL"
	exit 1
fi
echo "scripts/test.sh: PASS"
