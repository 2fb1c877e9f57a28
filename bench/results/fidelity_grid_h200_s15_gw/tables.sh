#!/usr/bin/env bash
# Issue 35, session 15 (H35G): every table of the note in one file (table.md), from run.sh's outputs.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
T() { $PY -m bench.simulator.fidelity_table "$@" | sed '$d' | sed '$d'; echo; }
H() { echo "**$1**"; echo; }
{ echo "# Issue 35, session 15 (H35G): the gateway's event loop in the simulator (bench/results/fidelity_grid_h200_s15_gw/tables.sh)"; echo
  echo "relative error (sim - live) / live in %, mean ± 95% Student-t interval over the runs; bold: the interval inside the bound (P50 5%, P99 10%, throughput 2%)."
  echo "Each block: rows 1-4 the first file, rows 5-8 the second (and so on), loads 0.5 / 0.8 / 0.95 / 1.2x."; echo
  H "6.7B bf16 512/128 (s14 call, seeds 0-4), LIVE step times fed back (a diagnostic: what is left is outside the steps): today's simulator | + gateway loop | + gateway loop + live plan lead | live plan lead alone"
  T replay_6.7b_live_off.json replay_6.7b_live_on.json replay_6.7b_live_on_lead.json replay_6.7b_live_lead.json
  H "6.7B, the session's profile (as run): today's simulator | + gateway loop | + gateway loop + live plan lead | live plan lead alone"
  T replay_6.7b_asrun_off.json replay_6.7b_asrun_on.json replay_6.7b_asrun_on_lead.json replay_6.7b_asrun_lead.json
  H "6.7B, session 13's call (an independent check: seeds 0-4, the old profile grid), LIVE step times: today's simulator | + gateway loop + live plan lead (terms measured from that call's logs)"
  T replay_6.7b-s13_live_off.json replay_6.7b-s13_live_on_lead.json
  for s in live asrun; do
    H "33B bf16 512/128, five seeds pooled (s11 seeds 0-2 + s13 seeds 3-4), $s: today's simulator"
    T --pool replay_33b-s11_${s}_off.json replay_33b-s13_${s}_off.json
    H "33B, $s: + gateway loop"
    T --pool replay_33b-s11_${s}_on.json replay_33b-s13_${s}_on.json
    H "33B, $s: + gateway loop + live plan lead"
    T --pool replay_33b-s11_${s}_on_lead.json replay_33b-s13_${s}_on_lead.json
  done
  H "Sensitivities, 6.7B live step times, gateway loop + live plan lead: the leads' means (2.39 / 4.05 ms) instead of medians | the loop's read term 1.5 ms instead of 0.87"
  T sens_6.7b_live_on_leadmean.json sens_6.7b_live_on_lead_read1.5.json
  H "Sensitivity, 33B as run, gateway loop + the live leads' means"
  T --pool sens_33b-s11_asrun_on_leadmean.json sens_33b-s13_asrun_on_leadmean.json
} > table.md
