#!/usr/bin/env bash
# Issue 35, session 15 (H35W): the simulator's two plan leads taken from the profile (`--plan-lead
# profile-kinds`: its plan_lead_ms, what `tidegate backend profile` records since 40ca47c) against the
# live step log's (`--plan-lead live`), both with the gateway loop on, on session 14's H200 6.7B logs
# (seeds 0-4), on the CPU. The s14 profile predates plan_lead_ms: make_profile.py adds it, computed the
# way the profiler does (sims.profile_cost.plan_leads on the profile's launch times). Run from this folder:
#   bash run.sh     (~2 min on 2 cores; paired.py: the per-seed differences, needs ../replay_6.7b_*_on.json)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
S14=../../fidelity_grid_h200_s14/6.7b
$PY make_profile.py $S14/profile_6.7b.json profile_6.7b.json
A67="$S14/validate_6.7b.json $S14/decisions_6.7b.jsonl.gz $S14/steps_6.7b.jsonl.gz --profile profile_6.7b.json"
rp() {  # steps (live | asrun) lead (profile-kinds | live)
  local x=""
  [ "$1" = live ] && x="--live-times"
  # shellcheck disable=SC2086
  $PY -m bench.simulator.validate_replay $A67 $x --gateway-loop on --plan-lead "$2" --json replay_6.7b_$1_$2.json \
    > replay_6.7b_$1_$2.txt
}
for s in live asrun; do rp $s profile-kinds & rp $s live & wait; done
$PY paired.py > paired.txt
