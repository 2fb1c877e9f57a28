#!/usr/bin/env bash
# Issue 35, session 18 (H35G): the live steps with prefill outside the profile's hull and what they carry.
# Run from anywhere; ~1 min for hull.py, ~1.3 min a subset on the 33B FP8 and ~2.5 on the 6.7B FP8 (2 cores).
#   bash run.sh [hull|whatif|budget|standin|identity]     (default all; identity needs BASE=<an extracted
#   tree of the commit before the change, e.g. git archive 0ea9c6d sims bench scheduler backend gateway proto>)
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
  $PY whatif.py 33b-fp8_s17 inside prefix1 outside > whatif_33b_counts.txt   # the same, with the counts
  $PY whatif.py 6.7b-fp8_s16 inside prefix1 outside > whatif_6.7b_counts.txt
fi
if [ "$WHAT" = all ] || [ "$WHAT" = budget ]; then
  $PY budget_point.py > budget_point.txt
  BUDGET_D=128 $PY budget_point.py > budget_point_d128.txt
fi
if [ "$WHAT" = all ] || [ "$WHAT" = standin ]; then
  STANDIN=d64 $PY whatif.py 33b-fp8_s17 none > whatif_33b_standin.txt
  STANDIN=d64 $PY whatif.py 6.7b-fp8_s16 none > whatif_6.7b_standin.txt
fi
if { [ "$WHAT" = all ] || [ "$WHAT" = identity ]; } && [ -n "${BASE:-}" ]; then
  (cd ../fidelity_packed_s18 && PYTHONPATH=$BASE $PY identity.py dump /tmp/identity_base.json \
     && $PY identity.py dump /tmp/identity_new.json \
     && $PY identity.py compare /tmp/identity_base.json /tmp/identity_new.json) > identity_compare.txt || true
fi
