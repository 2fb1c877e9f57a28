#!/usr/bin/env bash
# Issue 35, round 2: the per-stream delivery path built into the simulator, before/after tables
# (path_model.py, pool_path_model.py). Run from this folder: bash path_model.sh (~4 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PY:-../../../../.venv/bin/python}
export PYTHONPATH=$(cd ../../../.. && pwd)
S13=..; S11=../../fidelity_grid_h200_s11/33b; O=path_model
pm() { $PY path_model.py "$@"; }
# k held out (the OTHER model's fit, path_by_streams.txt): 6.7B 0.069 (33B), 33B 0.073 (6.7B)
{ pm $S13/6.7b 6.7b 1.7478 0.069 $S13/6.7b/profile_6.7b.json all $O/6.7b_asrun_k069.json
  pm $S13/6.7b 6.7b 1.7478 0.069 profile_6.7b_surrogate_db.json 2,3,4 $O/6.7b_surrogate_db_k069.json; } > $O/log_a.txt &
{ pm $S13/33b-seeds 33b-seeds 1.9008 0.073 $S13/33b-seeds/profile_33b-seeds.json all $O/33b-seeds_k073.json
  pm $S11 33b 1.5907 0.073 $S11/profile_33b.json all $O/33b-s11_k073.json; } > $O/log_b.txt &
wait
# k fitted from the same model's own runs (what sim validate's auto does): 6.7B 0.073, 33B 0.069 / 0.068
{ pm $S13/6.7b 6.7b 1.7478 0.073 $S13/6.7b/profile_6.7b.json all $O/6.7b_asrun_k073.json
  pm $S13/6.7b 6.7b 1.7478 0.073 profile_6.7b_surrogate_db.json 2,3,4 $O/6.7b_surrogate_db_k073.json; } > $O/log_c.txt &
{ pm $S13/33b-seeds 33b-seeds 1.9008 0.069 $S13/33b-seeds/profile_33b-seeds.json all $O/33b-seeds_k069.json
  pm $S11 33b 1.5907 0.068 $S11/profile_33b.json all $O/33b-s11_k068.json; } > $O/log_d.txt &
wait
{ $PY pool_path_model.py "6.7B bf16 512/128, seeds 0-4, as run (profile without capped chunks), k 0.069 from the 33B" $O/6.7b_asrun_k069.json
  echo; $PY pool_path_model.py "6.7B, what-if profile (new grid's points from seeds 0-1), held-out seeds 2-4, k 0.069 from the 33B" $O/6.7b_surrogate_db_k069.json
  echo; $PY pool_path_model.py "33B bf16 512/128, five seeds (s11 0-2 + s13 3-4), as run, k 0.073 from the 6.7B" $O/33b-s11_k073.json $O/33b-seeds_k073.json
  echo; $PY pool_path_model.py "6.7B as run, k 0.073 fitted from its own runs" $O/6.7b_asrun_k073.json
  echo; $PY pool_path_model.py "6.7B what-if profile, held-out seeds 2-4, k 0.073 own fit" $O/6.7b_surrogate_db_k073.json
  echo; $PY pool_path_model.py "33B five seeds, k 0.068 / 0.069 own fits" $O/33b-s11_k068.json $O/33b-seeds_k069.json; } > path_model.md
