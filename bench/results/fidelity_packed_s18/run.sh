#!/usr/bin/env bash
# Issue 35, session 18 (H35P): the sustained_packed run's what-if on the committed H200 parts, from
# this folder (~6 min on 2 cores):  bash run.sh [whatif|clocks|steps|replays|tables|time|identity]
#   identity: BASE=<a git archive of the tree before the change> (its sims/ is what "before" imports)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
G=..
on() { [ "$WHAT" = all ] || [ "$WHAT" = "$1" ]; }
if on whatif; then  # the stand-in r_packed per part, and the what-if profiles
  {
    for R in $G/fidelity_grid_h200_s17/33b-fp8 $G/fidelity_grid_h200_s16/33b-fp8 $G/fidelity_grid_h200_s16/6.7b-fp8 \
             $G/fidelity_grid_h200_s16/6.7b $G/fidelity_grid_h200_s13/33b-seeds $G/fidelity_grid_h200_s11/33b; do
      $PY -W ignore whatif_packed_run.py $R
    done
    echo; echo "# the what-if profiles"
    $PY -W ignore whatif_packed_run.py $G/fidelity_grid_h200_s17/33b-fp8 whatif_profile_s17_33b-fp8_packed.json
    for r in 1.06 1.10; do
      $PY -W ignore whatif_packed_run.py $G/fidelity_grid_h200_s17/33b-fp8 whatif_profile_s17_33b-fp8_packed_r$r.json --r $r
    done
    $PY -W ignore whatif_packed_run.py $G/fidelity_grid_h200_s16/6.7b-fp8 whatif_profile_s16_6.7b-fp8_packed.json
    $PY -W ignore whatif_packed_run.py $G/fidelity_grid_h200_s16/6.7b-fp8 whatif_profile_s16_6.7b-fp8_packed_tau0.3.json --tau 0.3
    $PY -W ignore whatif_packed_run.py $G/fidelity_grid_h200_s16/6.7b whatif_profile_s16_6.7b_mixed_packed.json \
        --profile $G/fidelity_cost_s16/profile_s16_6.7b_whatif_mixed.json
    $PY -W ignore whatif_packed_run.py $G/fidelity_grid_h200_s13/33b-seeds whatif_profile_s13_33b-seeds_mixed_packed.json \
        --profile $G/fidelity_cost_s16/profile_s13_33b-seeds_whatif_mixed.json
  } > whatif_packed_run.txt
fi
if on clocks; then
  for R in $G/fidelity_grid_h200_s17/33b-fp8 $G/fidelity_grid_h200_s16/33b-fp8 $G/fidelity_grid_h200_s16/6.7b-fp8 \
           $G/fidelity_grid_h200_s16/6.7b $G/fidelity_grid_h200_s13/33b-seeds; do $PY clocks_packed.py $R; done > clocks_packed.txt
fi
if on steps; then  # the cost model at every live step, by kind (session 16's step_table: cap_by_power on)
  ST="$PY -W ignore $G/fidelity_cost_s16/step_table.py"
  {
    $ST $G/fidelity_grid_h200_s17/33b-fp8 $G/fidelity_grid_h200_s17/33b-fp8/profile_33b-fp8.json \
        whatif_profile_s17_33b-fp8_packed.json whatif_profile_s17_33b-fp8_packed_r1.06.json whatif_profile_s17_33b-fp8_packed_r1.10.json
    $ST $G/fidelity_grid_h200_s16/6.7b-fp8 $G/fidelity_grid_h200_s16/6.7b-fp8/profile_6.7b-fp8.json \
        whatif_profile_s16_6.7b-fp8_packed.json whatif_profile_s16_6.7b-fp8_packed_tau0.3.json
    $ST $G/fidelity_grid_h200_s16/6.7b $G/fidelity_cost_s16/profile_s16_6.7b_whatif_mixed.json whatif_profile_s16_6.7b_mixed_packed.json
    $ST $G/fidelity_grid_h200_s13/33b-seeds $G/fidelity_cost_s16/profile_s13_33b-seeds_whatif_mixed.json \
        whatif_profile_s13_33b-seeds_mixed_packed.json
  } > step_table_whatif_packed.txt
fi
if on replays; then  # the s17 analysis's cap_lead form, one at a time
  P=$G/fidelity_grid_h200_s17/33b-fp8
  for x in asrun:$P/profile_33b-fp8.json packed:whatif_profile_s17_33b-fp8_packed.json \
           packed_r1.10:whatif_profile_s17_33b-fp8_packed_r1.10.json; do
    tag=${x%%:*}
    echo "$(date -u +%H:%M:%S) $tag" >&2
    $PY -m bench.simulator.validate_replay $P/validate_33b-fp8.json $P/decisions_33b-fp8.jsonl.gz \
        $P/steps_33b-fp8.jsonl.gz --profile "${x#*:}" --cap-by-power --gateway-loop on --plan-lead live \
        --json replay_s17_33b-fp8_cap_lead_$tag.json > replay_s17_33b-fp8_cap_lead_$tag.txt
  done
fi
if on tables; then
  for f in replay_*.json; do $PY -m bench.simulator.fidelity_table "$f" > "table_$(basename "${f#replay_}" .json).md"; done
fi
if on time; then $PY device_time.py > device_time.txt; fi
if on identity && [ -n "${BASE:-}" ]; then
  PYTHONPATH=$BASE $PY identity.py dump /tmp/identity_base.json
  $PY identity.py dump /tmp/identity_new.json
  $PY identity.py compare /tmp/identity_base.json /tmp/identity_new.json > identity_compare.txt || true
fi
