#!/usr/bin/env bash
# Issue 35, session 22: arrival_jitter.py over the committed grid parts, two forms each (4 draws):
#   jitter_<card>_<part>_delays.txt     the gateway -> engine delays drawn
#   jitter_<card>_<part>_both.txt       the delays and the steps' own scatter (empirical) drawn
# CPU only, ~4 min a part on 2 cores (~50 min in all). Run from the repo root:
#   bash bench/results/fidelity_race_s22/run.sh        (RESULTS=dir: the parts' folders elsewhere)
set -euo pipefail
PY=${PY:-.venv/bin/python}
HERE=bench/results/fidelity_race_s22
R=${RESULTS:-bench/results}
PARTS=${PARTS:-"h100:fidelity_grid_h100_s21/6.7b-mixed-seeds h100:fidelity_grid_h100_s21/6.7b-mixed-2
h200:fidelity_grid_h200_s20/6.7b-mixed h200:fidelity_grid_h200_s20/33b-mixed h200:fidelity_grid_h200_s20/33b-kvint4
h200:fidelity_grid_h200_s13/33b-seeds h200:fidelity_grid_h200_s11/33b h200:fidelity_grid_h200_s16/6.7b
h200:fidelity_grid_h200_s16/6.7b-fp8 h200:fidelity_grid_h200_s17/33b-fp8 h100:fidelity_grid_h100_s21/6.7b
h100:fidelity_grid_h100_s21/6.7b-seeds h100:fidelity_grid_h100_s21/6.7b-fp8-seeds"}
for cp in $PARTS; do
  card=${cp%%:*}; d=$R/${cp#*:}; p=$(basename "$d")
  echo "$(date -u +%H:%M:%S) $card $p" >&2
  DELAYS=on SCATTER=0 $PY $HERE/arrival_jitter.py "$d" 4 > $HERE/jitter_${card}_${p}_delays.txt &
  DELAYS=on SCATTER=empirical $PY $HERE/arrival_jitter.py "$d" 4 > $HERE/jitter_${card}_${p}_both.txt &
  wait
done
