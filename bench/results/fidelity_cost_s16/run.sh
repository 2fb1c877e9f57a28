#!/usr/bin/env bash
# Issue 35, session 16 (H35F): the power cap by step kind, scored on the committed H200 logs (no device
# time). Run from this folder:  bash run.sh [measure|whatif|steps|replays|tables]  (default all;
# measure + whatif + steps ~1 min, replays ~25 min on 2 cores, single-threaded each)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
B=..
# part directory : short tag
PARTS="fidelity_grid_h200_s16/33b-fp8:s16_33b-fp8 fidelity_grid_h200_s16/6.7b:s16_6.7b
fidelity_grid_h200_s16/6.7b-fp8:s16_6.7b-fp8 fidelity_grid_h200_s11/33b:s11_33b
fidelity_grid_h200_s13/33b-seeds:s13_33b-seeds fidelity_grid_h200_s14/6.7b:s14_6.7b"
each() { for x in $PARTS; do IFS=: read -r d t <<<"$x"; "$@" "$B/$d" "$t" "$(basename "$d")"; done; }
do_measure() { $PY measure.py "$1" > "measure_$2.txt"; }
do_whatif() { $PY whatif_mixed_run.py "$1" "profile_$2_whatif_mixed.json" > "whatif_mixed_run_$2.txt"; }
do_steps() {
  local w=""; [ -f "profile_$2_whatif_mixed.json" ] && w="profile_$2_whatif_mixed.json"
  # shellcheck disable=SC2086
  $PY step_table.py "$1" "$1/profile_$3.json" $w > "step_table_$2.txt"
}
rp() {  # part-dir tag profile out (whatif_replay.py: validate_replay with the opt-in cap_by_power on;
        # the parts' own profiles have no "sustained_mixed" run: the default model, unchanged)
  local d=$1 p; p=$(basename "$d")
  $PY whatif_replay.py --gateway-loop off --plan-lead profile "$d/validate_$p.json" "$d/decisions_$p.jsonl.gz" "$d/steps_$p.jsonl.gz" \
      --profile "$3" --json "replay_$2_$4.json" > "replay_$2_$4.txt"
}
[ "$WHAT" = all ] || [ "$WHAT" = measure ] && each do_measure
[ "$WHAT" = all ] || [ "$WHAT" = whatif ] && each do_whatif
[ "$WHAT" = all ] || [ "$WHAT" = steps ] && each do_steps
if [ "$WHAT" = all ] || [ "$WHAT" = replays ]; then
  # as run (today's tree, the part's own profile: must reproduce the committed replay) and the what-if
  S16=$B/fidelity_grid_h200_s16
  rp $S16/33b-fp8 s16_33b-fp8 $S16/33b-fp8/profile_33b-fp8.json asrun &
  rp $S16/33b-fp8 s16_33b-fp8 profile_s16_33b-fp8_whatif_mixed.json whatif_mixed & wait
  rp $S16/6.7b s16_6.7b $S16/6.7b/profile_6.7b.json asrun &
  rp $S16/6.7b s16_6.7b profile_s16_6.7b_whatif_mixed.json whatif_mixed & wait
  for x in s11:33b s13:33b-seeds; do
    IFS=: read -r s t <<<"$x"; d=$B/fidelity_grid_h200_$s/$t
    rp "$d" "${s}_$t" "$d/profile_$t.json" asrun & rp "$d" "${s}_$t" "profile_${s}_${t}_whatif_mixed.json" whatif_mixed & wait
  done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = tables ]; then
  for f in replay_*.json; do t=${f#replay_}; $PY -m bench.simulator.fidelity_table "$f" > "table_${t%.json}.md"; done
  $PY -m bench.simulator.fidelity_table --pool replay_s11_33b_asrun.json replay_s13_33b-seeds_asrun.json > table_33b_bf16_pooled_asrun.md
  $PY -m bench.simulator.fidelity_table --pool replay_s11_33b_whatif_mixed.json replay_s13_33b-seeds_whatif_mixed.json > table_33b_bf16_pooled_whatif_mixed.md
fi
