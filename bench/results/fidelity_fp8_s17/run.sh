#!/usr/bin/env bash
# Issue 35, session 17 (H35Q): the 6.7B FP8 step-cost under-prediction, from committed H200 logs (no device
# time). Run from this folder:  bash run.sh [bins|replays|tables]   (default all; bins ~3 min, replays
# ~3 min on 2 cores)
# bins: the cost model at every live step, binned (step_bins, dec_by_d, dec_after, mixed_by_d, big_steps),
#   for the parts' own profiles as validate_replay builds them, decode tail nearest (the default) and slope
#   (opt-in); the s17 33B FP8 part's (main: ../fidelity_grid_h200_s17/33b-fp8, S17=...) with the default.
# replays: validate_replay per part, decode_extrapolation nearest (the default; reproduces the committed
#   s13/s16/s17 tables) and slope (opt-in), with the simulator as those tables ran it (--gateway-loop off
#   --plan-lead profile, named: main has since made the gateway loop and measured leads the default);
#   tables: fidelity_table of each.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
S16=../fidelity_grid_h200_s16
PARTS="$S16/6.7b-fp8 $S16/6.7b $S16/33b-fp8 ../fidelity_grid_h200_s13/33b-seeds"
if [ "$WHAT" = all ] || [ "$WHAT" = bins ]; then
  for m in nearest slope; do
    export DECODE_TAIL=$m
    for d in $S16/6.7b-fp8 $S16/6.7b; do
      p=$(basename "$d")
      $PY step_bins.py "$d" > "step_bins_${p}_$m.txt" &
      $PY dec_by_d.py "$d" > "dec_by_d_${p}_$m.txt"; wait
      $PY dec_after.py "$d" > "dec_after_${p}_$m.txt" &
      $PY mixed_by_d.py "$d" > "mixed_by_d_${p}_$m.txt"; wait
      $PY big_steps.py "$d" > "big_steps_${p}_$m.txt"
    done
  done
  unset DECODE_TAIL
fi
rp() {  # part-dir mode
  local d=$1 p; p=$(basename "$1")
  $PY replay_mode.py "$2" "$d/validate_$p.json" "$d/decisions_$p.jsonl.gz" "$d/steps_$p.jsonl.gz" \
      --profile "$d/profile_$p.json" --gateway-loop off --plan-lead profile --json "replay_${p}_$2.json" > "replay_${p}_$2.txt"
}
# the lead's s17 33B FP8 part (main, 97f515f), replayed with --cap-by-power as its own tables are
S17=${S17:-../fidelity_grid_h200_s17/33b-fp8}
rp17() {
  $PY replay_mode.py "$1" "$S17/validate_33b-fp8.json" "$S17/decisions_33b-fp8.jsonl.gz" "$S17/steps_33b-fp8.jsonl.gz" \
      --profile "$S17/profile_33b-fp8.json" --cap-by-power --gateway-loop off --plan-lead profile --json "replay_s17_33b-fp8_cap_$1.json" > "replay_s17_33b-fp8_cap_$1.txt"
}
if [ "$WHAT" = all ] || [ "$WHAT" = replays ]; then
  for d in $PARTS; do rp "$d" nearest & rp "$d" slope & wait; done
  if [ -d "$S17" ]; then rp17 nearest & rp17 slope & wait; fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = bins ]; then
  if [ -d "$S17" ]; then
    $PY step_bins.py "$S17" > step_bins_s17_33b-fp8_nearest.txt &
    $PY dec_by_d.py "$S17" > dec_by_d_s17_33b-fp8_nearest.txt; wait
    $PY mixed_by_d.py "$S17" > mixed_by_d_s17_33b-fp8_nearest.txt
  fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = tables ]; then
  for f in replay_*.json; do t=${f#replay_}; $PY -m bench.simulator.fidelity_table "$f" > "table_${t%.json}.md"; done
fi
