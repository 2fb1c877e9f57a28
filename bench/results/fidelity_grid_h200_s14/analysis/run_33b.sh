#!/usr/bin/env bash
# Issue 35, session 14: the 33B's five seeds (s11 seeds 0-2 + s13 seeds 3-4) with today's simulator,
# and the two open 33B questions, re-computed on the CPU from the committed logs (~6 min, 2 cores):
#   table_33b_today.md   sim validate's replay + delivery path re-run (validate_replay, k fitted per
#                        session as sim validate does), pooled (fidelity_table --pool);
#   ttft_spread.txt      the TTFT P50 intervals: seed noise or the call's step-cost level?
#   chunks_noise.txt     same prefill chunks at 0.95x: which step-cost error parts the schedules?
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
S11=../../fidelity_grid_h200_s11/33b; S13=../../fidelity_grid_h200_s13/33b-seeds
$PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $S11/validate_33b.json $S11/decisions_33b.jsonl.gz $S11/steps_33b.jsonl.gz \
  --profile $S11/profile_33b.json --json replay_33b-s11_today.json > replay_33b-s11_today.txt
$PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $S13/validate_33b-seeds.json $S13/decisions_33b-seeds.jsonl.gz \
  $S13/steps_33b-seeds.jsonl.gz --profile $S13/profile_33b-seeds.json --json replay_33b-seeds_today.json \
  > replay_33b-seeds_today.txt
$PY -m bench.simulator.fidelity_table --pool replay_33b-s11_today.json replay_33b-seeds_today.json > table_33b_today.md
$PY ttft_spread.py > ttft_spread.txt
$PY chunks_noise.py > chunks_noise.txt
