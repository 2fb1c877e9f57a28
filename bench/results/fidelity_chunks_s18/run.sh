#!/usr/bin/env bash
# Issue 35, session 18 (H35C): where the steps with prefill go wrong per kind, and what bounds the same
# prefill chunks at 0.95x, from the committed H200 parts (no device time). Run from this folder:
#   bash run.sh [bins|bounds|all]     (default all; bins ~4 min, bounds ~15 min on 2 cores)
# bins:   chunk_bins.txt/json  log(model/live) of the steps with prefill by candidate, per call and load
#         call_level.txt       two calls of one model at the same shapes; the candidates regressed jointly;
#                              the live steps' own scatter at one exact shape
#         loo.txt              the model against the profile's own points (leave one out; the 33B bf16 grid
#                              re-made on the 6.7B grids)
# bounds: level_bound.txt      live step times, steps with prefill x a level: same chunks by load
#         scatter_bound.txt    the same with a zero-mean iid scatter instead
#         shape_mean.txt, shape_median.txt   each step with prefill at its shape group's mean / median live time
#         shape_mean_state.txt the groups split by the 100 ms prefill-busy share too (the cap model's input)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
if [ "$WHAT" = all ] || [ "$WHAT" = bins ]; then
  $PY chunk_bins.py --json chunk_bins.json > chunk_bins.txt
  $PY call_level.py > call_level.txt
  $PY loo.py > loo.txt
fi
if [ "$WHAT" = all ] || [ "$WHAT" = bounds ]; then
  $PY level_bound.py 1.0 0.999 1.001 0.9985 1.0015 0.9975 1.0025 0.995 1.005 0.99 1.01 0.985 1.015 0.98 1.02 \
      0.97 1.03 > level_bound.txt
  $PY level_bound.py --scatter 0.001 0.005 0.01 0.02 0.04 > scatter_bound.txt
  $PY shape_mean.py --stat mean > shape_mean.txt
  $PY shape_mean.py --stat median > shape_median.txt
  $PY shape_mean.py --stat mean --state > shape_mean_state.txt
fi
