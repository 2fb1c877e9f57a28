#!/usr/bin/env bash
# Issue 35, session 21: the async loop's plan lead as a line in the duration of the step it plans
# behind (`validate_replay --plan-lead live-line`, bench.simulator.plan_lead.plan_lead_lines) against
# the grid state's per-kind medians (`live`, the default): a sensitivity. Run from this folder
# (~1 min on 2 cores): bash lead_line.sh  -> lead_line_<part>.txt (the replay's lines for both leads)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
one() {  # dir tag
  local d=$1 tag=$2 p; p=$(basename "$d")
  $PY -m bench.simulator.validate_replay "$d/validate_$p.json" "$d/decisions_$p.jsonl.gz" "$d/steps_$p.jsonl.gz" \
      --profile "$d/profile_$p.json" --cap-by-power --gateway-loop on --plan-lead live-line > "/tmp/lead_line_$tag.txt"
  { echo "== $tag: --plan-lead live-line"; grep -E "^plan lead|^ *(0.5|0.8|0.95|1.2)x" "/tmp/lead_line_$tag.txt"
    echo "== $tag: --plan-lead live (the grid state's)"; grep -E "^plan lead|^ *(0.5|0.8|0.95|1.2)x" "$3"; } > "lead_line_$tag.txt"
}
one ../6.7b h100-6.7b replay_6.7b_asrun_default.txt &
one ../6.7b-mixed-seeds h100-6.7b-mixed-seeds replay_6.7b-mixed-seeds_asrun_default.txt & wait
one ../../fidelity_grid_h200_s20/6.7b-mixed h200-6.7b-mixed ../../fidelity_grid_h200_s20/analysis/replay_6.7b-mixed_asrun_default.txt &
one ../../fidelity_grid_h200_s20/33b-kvint4 h200-33b-kvint4 ../../fidelity_grid_h200_s20/analysis/replay_33b-kvint4_asrun_default.txt & wait
