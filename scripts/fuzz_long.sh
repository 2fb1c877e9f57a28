#!/usr/bin/env bash
# The long forms of the fuzz suites (issue 13): 10,000 HTTP bodies (and the every-field,
# every-JSON-type sweep) and 10,000 messages on each ZeroMQ socket (front door, backend worker).
# CI runs the same tests with fewer examples. The raw output (status counts per suite) is kept:
#   scripts/fuzz_long.sh [N]   # N examples per suite (default 10000); FUZZ_SEED=... to vary;
#                              # output in $OUT (default bench/results/fuzz)/fuzz_long_N_<rev>.txt
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-10000}"
OUT="${OUT:-bench/results/fuzz}"
REV="${REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
mkdir -p "$OUT"
{
  echo "# scripts/fuzz_long.sh $N at $REV, $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  FUZZ_HTTP_BODIES="$N" FUZZ_FRAMES="$N" .venv/bin/python -m pytest -q -s -p no:cacheprovider \
    tests/test_fuzz_http.py tests/test_fuzz_frames.py
} 2>&1 | tee "$OUT/fuzz_long_${N}_${REV}.txt"
