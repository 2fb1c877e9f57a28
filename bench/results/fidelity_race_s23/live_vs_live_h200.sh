#!/usr/bin/env bash
# Issue 35, session 23: two H200 calls that ran one workload (the same seeds, rates within 0.5-0.9%,
# engine code alike for it: the commits between them touched only opt-in admission and the KV pull),
# compared live against live as the grid compares the simulator with a live run
# (`../fidelity_race_s22/live_vs_live.py`). Run from the repo root (CPU, ~1 min):
#   bash bench/results/fidelity_race_s23/live_vs_live_h200.sh > bench/results/fidelity_race_s23/live_vs_live_h200.txt
set -euo pipefail
PY=${PY:-.venv/bin/python}
R=bench/results
export PYTHONPATH=$PWD
echo "# 6.7B bf16 512/128: session 13 (git 8d53ec8) against session 14 (git 5f1bf0d), rates 0.5% apart"
for s in 0 1 2 3 4; do $PY $R/fidelity_race_s22/live_vs_live.py $R/fidelity_grid_h200_s13/6.7b $s $R/fidelity_grid_h200_s14/6.7b $s; done
echo
echo "# 33B FP8 512/128: session 16 (git 255d793) against session 17 (git fb53f40), rates 0.85% apart"
for s in 0 1 2; do $PY $R/fidelity_race_s22/live_vs_live.py $R/fidelity_grid_h200_s16/33b-fp8 $s $R/fidelity_grid_h200_s17/33b-fp8 $s; done
echo
echo "# sensitivity to the rates: 6.7B session 14 against session 16 (git 255d793; only opt-in admission and"
echo "# waiting-by-class changed since 5f1bf0d), rates 1.6% apart; session 13 against 16, 2.2% apart"
for s in 0 1 2 3 4; do $PY $R/fidelity_race_s22/live_vs_live.py $R/fidelity_grid_h200_s14/6.7b $s $R/fidelity_grid_h200_s16/6.7b $s; done
for s in 0 1 2 3 4; do $PY $R/fidelity_race_s22/live_vs_live.py $R/fidelity_grid_h200_s13/6.7b $s $R/fidelity_grid_h200_s16/6.7b $s; done
