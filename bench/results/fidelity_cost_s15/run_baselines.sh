#!/usr/bin/env bash
# the as-run replays with today's tree (the what-ifs' baselines: same simulator, the parts' own profiles)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../../.. && pwd); PY=$ROOT/.venv/bin/python; export PYTHONPATH=$ROOT
R=../fidelity_grid_h200_s14/6.7b
$PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $R/validate_6.7b.json $R/decisions_6.7b.jsonl.gz $R/steps_6.7b.jsonl.gz \
  --profile $R/profile_6.7b.json --seeds 2,3,4 --json replay_6.7b_asrun_heldout.json > replay_6.7b_asrun_heldout.txt
$PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $R/validate_6.7b.json $R/decisions_6.7b.jsonl.gz $R/steps_6.7b.jsonl.gz \
  --profile $R/profile_6.7b.json --json replay_6.7b_asrun.json > replay_6.7b_asrun.txt
for x in s11:33b s13:33b-seeds; do
  IFS=: read -r s t <<<"$x"
  R=../fidelity_grid_h200_$s/$t
  $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $R/validate_$t.json $R/decisions_$t.jsonl.gz $R/steps_$t.jsonl.gz \
    --profile $R/profile_$t.json --json replay_${t}_${s}_asrun.json > replay_${t}_${s}_asrun.txt
done
$PY -m bench.simulator.fidelity_table --pool replay_33b_s11_asrun.json replay_33b-seeds_s13_asrun.json > table_33b_asrun.md
