#!/usr/bin/env bash
# Issue 35, session 18 (H35G): the live steps with prefill outside the profile's hull and what they carry.
# Run from anywhere; ~1 min for hull.py, ~1.3 min a subset on the 33B FP8 and ~2.5 on the 6.7B FP8 (2 cores).
#   bash run.sh [hull|whatif]     (default both)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
if [ "$WHAT" = all ] || [ "$WHAT" = hull ]; then
  $PY hull.py > hull.txt
fi
if [ "$WHAT" = all ] || [ "$WHAT" = whatif ]; then
  $PY whatif.py 33b-fp8_s17 none packed outside > whatif_33b.txt
  $PY whatif.py 6.7b-fp8_s16 none packed outside > whatif_6.7b.txt
  $PY whatif.py 33b-fp8_s17 prefix1 inside 'd>dmax' > whatif_33b_2.txt
  $PY whatif.py 6.7b-fp8_s16 prefix1 inside 'd>dmax' > whatif_6.7b_2.txt
  $PY whatif.py 33b-fp8_s17 packed packed_x > whatif_33b_3.txt
  $PY whatif.py 6.7b-fp8_s16 packed packed_x > whatif_6.7b_3.txt
fi
