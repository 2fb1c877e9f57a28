#!/usr/bin/env bash
# the 33B (s11 seeds 0-2, s13 seeds 3-4) with the what-if trace (tau 0.2 s, r = the call's own
# back-to-back / paused) on the decode-bucket what-if profiles; validate_replay as the s14 analysis
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../../.. && pwd); PY=$ROOT/.venv/bin/python; export PYTHONPATH=$ROOT
for x in ${ONLY:-s11:33b:1.131 s13:33b-seeds:1.1146}; do
  IFS=: read -r s t r <<<"$x"
  R=../fidelity_grid_h200_$s/$t
  $PY whatif_sustained_trace.py $R profile_${t}_${s}_whatif_firsts.json 0.2 $r 0,1 profile_${t}_${s}_whatif_firsts_trace.json \
    > whatif_sustained_trace_${t}_${s}.txt
  for p in whatif_firsts whatif_firsts_trace; do
    $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $R/validate_$t.json $R/decisions_$t.jsonl.gz $R/steps_$t.jsonl.gz \
      --profile profile_${t}_${s}_$p.json --json replay_${t}_${s}_$p.json > replay_${t}_${s}_$p.txt
  done
done
$PY -m bench.simulator.fidelity_table --pool replay_33b_s11_whatif_firsts.json replay_33b-seeds_s13_whatif_firsts.json > table_33b_whatif_firsts.md
$PY -m bench.simulator.fidelity_table --pool replay_33b_s11_whatif_firsts_trace.json replay_33b-seeds_s13_whatif_firsts_trace.json > table_33b_whatif_firsts_trace.md
