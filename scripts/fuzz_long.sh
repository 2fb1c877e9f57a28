#!/usr/bin/env bash
# The long forms of the fuzz suites (issue 13): 10,000 HTTP bodies and 10,000 messages on each
# ZeroMQ socket (front door, backend worker). CI runs the same tests with fewer examples.
#   scripts/fuzz_long.sh [N]        # N examples per suite (default 10000); FUZZ_SEED=... to vary
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-10000}"
FUZZ_HTTP_BODIES="$N" FUZZ_FRAMES="$N" .venv/bin/python -m pytest -q -s -p no:cacheprovider \
  tests/test_fuzz_http.py tests/test_fuzz_frames.py
