#!/usr/bin/env bash
# Issue 35, session 14: every table of the note in one file (table.md), from run.sh's and run_33b.sh's outputs.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
T() { $PY -m bench.simulator.fidelity_table "$@" | sed '$d' | sed '$d'; echo; }
{ echo "# Issue 35, session 14: fidelity tables (bench/results/fidelity_grid_h200_s14/analysis/tables.sh)"; echo
  echo "relative error (sim - live) / live in %, mean ± 95% Student-t interval over the runs; bold: the interval inside the bound (P50 5%, P99 10%, throughput 2%)"; echo
  echo "**6.7B bf16 512/128, H200, seeds 0-4 (this session's call): sim validate's replay + delivery path, as run (the fidelity table)**"; echo
  T ../6.7b/validate_6.7b.json
  echo "**6.7B: sim validate's independent simulation (the generator's schedule)**"; echo
  T --which run ../6.7b/validate_6.7b.json
  echo "**6.7B: LIVE step times fed back (fidelity_steps --live-times; a diagnostic): what is left outside the steps**"; echo
  T --validate ../6.7b/validate_6.7b.json steps_6.7b_live_times.json
  echo "**6.7B, held-out seeds 2-4: as run, and the what-if with the power cap the pause check missed (r 1.05 from seeds 0-1's live steps; whatif_sustained_cap.py)**"; echo
  T replay_6.7b_heldout.json replay_6.7b_sustained_whatif.json
  echo "**6.7B what-if: the window's lateness at the lowest load (0.62 ms) added to every dispatch, as run (all seeds) and with the sustained-cap what-if (held-out seeds 2-4)**"; echo
  T replay_6.7b_window_late.json replay_6.7b_sustained_whatif_window_late.json
  echo "**The prediction this call tested: the s13 6.7B logs with the s13 what-if profile (validate_replay, held-out seeds 2-4), and the s13 logs with this call's measured profile (all seeds)**"; echo
  T replay_s13_6.7b_whatif.json replay_s13_6.7b_with_s14_profile.json
  echo "**33B bf16 512/128, five seeds (s11 seeds 0-2 + s13 seeds 3-4): today's simulator (validate_replay, k fitted per call; the column names the s11 call's path)**"; echo
  T --pool replay_33b-s11_today.json replay_33b-seeds_today.json
} > table.md
