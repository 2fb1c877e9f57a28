#!/usr/bin/env bash
# Issue 35, session 33: every committed grid part priced in the simulator's default form and with
# --mixed-tiles on (sims.profile_cost, "Whole tiles beside a chunk"), CPU only, no ceiling draws:
#   bash bench/results/conditioned_s33/mixed_tiles_compare.sh            (~15 min on 2 cores)
# Writes mixed_tiles/<name>_{default,tiles}.{json,md} and mixed_tiles/summary.md (count.py's tally).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../../.. && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
R=..
declare -A SRC=(
  [h100-6.7b-fp8-s33]=conditioned_s33/h100_6.7b-fp8/6.7b-fp8
  [h100-6.7b-fp8-s31]=fidelity_h100_s31/6.7b-fp8
  [h100-6.7b-s31]=fidelity_h100_s31/6.7b
  [33b-s11]=fidelity_grid_h200_s11/33b [33b-s13]=fidelity_grid_h200_s13/33b-seeds
  [6.7b-s13]=fidelity_grid_h200_s13/6.7b [6.7b-s14]=fidelity_grid_h200_s14/6.7b [6.7b-s16]=fidelity_grid_h200_s16/6.7b
  [6.7b-fp8-s16]=fidelity_grid_h200_s16/6.7b-fp8 [33b-fp8-s16]=fidelity_grid_h200_s16/33b-fp8
  [33b-fp8-s17]=fidelity_grid_h200_s17/33b-fp8 [6.7b-mixed-s20]=fidelity_grid_h200_s20/6.7b-mixed
  [33b-kvint4-s20]=fidelity_grid_h200_s20/33b-kvint4 [33b-mixed-s20]=fidelity_grid_h200_s20/33b-mixed
  [6.7b-mixed-s25]=fidelity_grid_h200_s25/6.7b-mixed-seeds [6.7b-mixed-s25-4]=fidelity_grid_h200_s25/seed4/6.7b-mixed-seeds
  [33b-mixed-s25-1]=fidelity_grid_h200_s25/33b-mixed-1 [33b-mixed-s25-2]=fidelity_grid_h200_s25/33b-mixed-2
)
ORDER=${PARTS:-"h100-6.7b-fp8-s33 h100-6.7b-fp8-s31 h100-6.7b-s31 6.7b-s14 6.7b-s16 6.7b-fp8-s16 6.7b-mixed-s20
  6.7b-mixed-s25 6.7b-mixed-s25-4 6.7b-s13 33b-s11 33b-s13 33b-fp8-s16 33b-fp8-s17 33b-kvint4-s20 33b-mixed-s20
  33b-mixed-s25-1 33b-mixed-s25-2"}
mkdir -p mixed_tiles
one() {  # name form
  local d=$R/${SRC[$1]} p=${SRC[$1]##*/} extra=""
  [ "$2" = tiles ] && extra="--mixed-tiles on"
  # shellcheck disable=SC2086
  $PY -m bench.simulator.validate_replay "$d/validate_$p.json" "$d/decisions_$p.jsonl.gz" "$d/steps_$p.jsonl.gz" \
      --profile "$d/profile_$p.json" $extra --json "mixed_tiles/$1_$2.json" > "mixed_tiles/$1_$2.txt" 2>&1
  $PY -m bench.simulator.fidelity_table "mixed_tiles/$1_$2.json" > "mixed_tiles/$1_$2.md"
}
for n in $ORDER; do
  echo "$(date -u +%H:%M:%S) $n" >&2
  one "$n" default & one "$n" tiles; wait
done
gzip -f mixed_tiles/*.json
$PY mixed_tiles_count.py mixed_tiles $ORDER > mixed_tiles/summary.md
cat mixed_tiles/summary.md
