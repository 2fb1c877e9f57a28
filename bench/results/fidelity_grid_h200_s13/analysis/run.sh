#!/usr/bin/env bash
# Issue 35, the grid's 33b-seeds and 6.7b parts (2026-12-04 night): re-simulations on the CPU from the
# committed logs (no device time). Run from this folder: bash run.sh (~2 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PY:-../../../../.venv/bin/python}
export PYTHONPATH=$(cd ../../../.. && pwd)
S13=..; S11=../../fidelity_grid_h200_s11/33b
steps() {  # dir tag lead_ms delivery_ms profile out [extra]
  local R=$1 T=$2 L=$3 D=$4 P=$5 O=$6; shift 6
  $PY -m bench.simulator.fidelity_steps $R/validate_$T.json $R/decisions_$T.jsonl.gz $R/steps_$T.jsonl.gz \
    $P --async-plan-lead-ms $L --delivery-ms $D --hide-launch --prefill-launch-deadline \
    --network-delay-ms auto --power-cap "$@" --json $O.json > $O.txt
}
# what-if profiles: the points the fixed profile grid adds (256-token chunks from position 0 and
# 256), their times from the live steps of the TRAIN seeds only (surrogate_points.py)
$PY surrogate_points.py $S13/6.7b 6.7b 0,1 profile_6.7b_surrogate.json > surrogate_6.7b.txt
$PY surrogate_points.py $S13/33b-seeds 33b-seeds 3 profile_33b-seeds_surrogate.json > surrogate_33b-seeds.txt
$PY surrogate_points.py $S11 33b 0 profile_33b-s11_surrogate.json > surrogate_33b-s11.txt
# the same + the decode-only points at the decode-graph buckets 24 and 48 (the profiler's new points)
$PY surrogate_points.py $S13/6.7b 6.7b 0,1 profile_6.7b_surrogate_db.json --decode-buckets > surrogate_6.7b_db.txt
$PY surrogate_points.py $S13/33b-seeds 33b-seeds 3 profile_33b-seeds_surrogate_db.json --decode-buckets > surrogate_33b-seeds_db.txt
$PY surrogate_points.py $S11 33b 0 profile_33b-s11_surrogate_db.json --decode-buckets > surrogate_33b-s11_db.txt
# 6.7B: as run (the validate's model terms), the live step times fed back (diagnostic), what-if
steps $S13/6.7b 6.7b 1.7478 2.5389 $S13/6.7b/profile_6.7b.json steps_6.7b_asrun
steps $S13/6.7b 6.7b 1.7478 2.5389 $S13/6.7b/profile_6.7b.json steps_6.7b_live_times --live-times
steps $S13/6.7b 6.7b 1.7478 2.5389 profile_6.7b_surrogate.json steps_6.7b_surrogate
steps $S13/6.7b 6.7b 1.7478 2.5389 profile_6.7b_surrogate_db.json steps_6.7b_surrogate_db
# 33B: seeds 3-4 (this session) and 0-2 (s11), the same three
steps $S13/33b-seeds 33b-seeds 1.9008 3.0349 $S13/33b-seeds/profile_33b-seeds.json steps_33b-seeds_asrun
steps $S13/33b-seeds 33b-seeds 1.9008 3.0349 $S13/33b-seeds/profile_33b-seeds.json steps_33b-seeds_live_times --live-times
steps $S13/33b-seeds 33b-seeds 1.9008 3.0349 profile_33b-seeds_surrogate.json steps_33b-seeds_surrogate
steps $S13/33b-seeds 33b-seeds 1.9008 3.0349 profile_33b-seeds_surrogate_db.json steps_33b-seeds_surrogate_db
steps $S11 33b 1.5907 3.1985 $S11/profile_33b.json steps_33b-s11_asrun
steps $S11 33b 1.5907 3.1985 $S11/profile_33b.json steps_33b-s11_live_times --live-times
steps $S11 33b 1.5907 3.1985 profile_33b-s11_surrogate.json steps_33b-s11_surrogate
steps $S11 33b 1.5907 3.1985 profile_33b-s11_surrogate_db.json steps_33b-s11_surrogate_db
$PY pooled_table.py > table.md
$PY ttft_parts.py $S13/6.7b 6.7b 1.7478 2.5389 profile_6.7b_surrogate_db.json > ttft_parts_6.7b.txt
$PY ttft_parts.py $S13/33b-seeds 33b-seeds 1.9008 3.0349 profile_33b-seeds_surrogate_db.json > ttft_parts_33b-seeds.txt
$PY step_gaps.py $S13/6.7b/steps_6.7b.jsonl.gz $S13/33b-seeds/steps_33b-seeds.jsonl.gz > step_gaps.txt
# the path: out against the streams of the first-token step (per run), and the what-if of a
# per-stream path (k from the other model: 0.069 ms for the 6.7B from the 33B, 0.073 for the 33B)
$PY path_by_streams.py $S13/6.7b/validate_6.7b.json $S13/6.7b/decisions_6.7b.jsonl.gz $S13/6.7b/steps_6.7b.jsonl.gz \
  $S13/33b-seeds/validate_33b-seeds.json $S13/33b-seeds/decisions_33b-seeds.jsonl.gz $S13/33b-seeds/steps_33b-seeds.jsonl.gz \
  $S11/validate_33b.json $S11/decisions_33b.jsonl.gz $S11/steps_33b.jsonl.gz > path_by_streams.txt
{ $PY path_whatif.py $S13/6.7b 6.7b 1.7478 2.5389 0.069 $S13/6.7b/profile_6.7b.json
  $PY path_whatif.py $S13/6.7b 6.7b 1.7478 2.5389 0.069 profile_6.7b_surrogate_db.json 2,3,4
  $PY path_whatif.py $S13/33b-seeds 33b-seeds 1.9008 3.0349 0.073 $S13/33b-seeds/profile_33b-seeds.json all path_whatif_33b-seeds.json
  $PY path_whatif.py $S11 33b 1.5907 3.1985 0.073 $S11/profile_33b.json all path_whatif_33b-s11.json
  echo "33B, five seeds pooled:"; $PY pool_path_whatif.py path_whatif_33b-s11.json path_whatif_33b-seeds.json; } > path_whatif.txt
# the per-stream delivery path built into the simulator (round 2): before/after tables -> path_model.md
bash path_model.sh
