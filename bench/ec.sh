#!/usr/bin/env bash
# Issue 5 erasure-coding figures through the CLI on real servers (two MinIO,
# fake-gcs-server, Azurite; scripts/test-deps.sh installs them): storage
# overhead of copies:2 and ec:2+2 (bytes the stores list / bytes put) for
# 4 KiB, 16 KiB and 1 MiB files, and read throughput (cat --no-cache, median
# of 3) of a 32 MiB file under ec:2+2 and under copies:2 with all four stores
# up and with one (m1) down. Prints FIGURE lines.
set -euo pipefail
cd "$(dirname "$0")/.."
CAIRN_EC_FIGURES=1 CAIRN_REQUIRE_CLOUD_SERVERS=1 go test ./internal/cli -run '^TestECFigures$' -count=1 -v -timeout 20m | grep -E 'FIGURE|PASS|FAIL|ok'
