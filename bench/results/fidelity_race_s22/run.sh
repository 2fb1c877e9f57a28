#!/usr/bin/env bash
# Issue 35, session 22: arrival_jitter.py over the committed grid parts, two forms each:
#   jitter_<card>_<part>_delays.txt     the gateway -> engine delays drawn (3 draws)
#   jitter_<card>_<part>_both.txt       the delays and the steps' own scatter (empirical) drawn
# CPU only, ~3-6 min a part on 2 cores. Run from the repo root: bash bench/results/fidelity_race_s22/run.sh
set -euo pipefail
PY=${PY:-.venv/bin/python}
HERE=bench/results/fidelity_race_s22
PARTS=${PARTS:-"h100:fidelity_grid_h100_s21/6.7b h100:fidelity_grid_h100_s21/6.7b-fp8-seeds
h100:fidelity_grid_h100_s21/6.7b-mixed-seeds h100:fidelity_grid_h100_s21/6.7b-mixed-2
h200:fidelity_grid_h200_s16/6.7b h200:fidelity_grid_h200_s16/6.7b-fp8 h200:fidelity_grid_h200_s17/33b-fp8
h200:fidelity_grid_h200_s13/33b-seeds h200:fidelity_grid_h200_s11/33b h200:fidelity_grid_h200_s20/6.7b-mixed
h200:fidelity_grid_h200_s20/33b-kvint4 h200:fidelity_grid_h200_s20/33b-mixed"}
for cp in $PARTS; do
  card=${cp%%:*}; d=${RESULTS:-bench/results}/${cp#*:}; p=$(basename "$d")
  echo "$(date -u +%H:%M:%S) $card $p" >&2
  DELAYS=on SCATTER=0 $PY $HERE/arrival_jitter.py "$d" 3 > $HERE/jitter_${card}_${p}_delays.txt &
  DELAYS=on SCATTER=empirical $PY $HERE/arrival_jitter.py "$d" 3 > $HERE/jitter_${card}_${p}_both.txt &
  wait
done
