#!/usr/bin/env bash
# Session 36: what the tiles terms would do on the profiles without tile-edge pairs (every H200 part, the H100's
# sessions 33-34), charged at the H100 pairs' pooled fractions (mixed a whole tile, decode-only 0.22: session 35)
# beside the default (no tiles without pairs). CPU only, no ceiling draws (~20 s a part's form on 2 cores):
#   bash bench/results/pairs_s36/tiles_pairless.sh [OUTDIR]       (from the repo root; writes OUTDIR/<part>_<form>.json)
# then python bench/results/pairs_s36/count_forms.py OUTDIR
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
O=${1:-$ROOT/bench/results/pairs_s36/pairless}; mkdir -p "$O"
G=${G:-$ROOT/bench/results}  # G=/tmp/copy: read the parts from a copy (device_slim.sh out removes them)
# part name -> folder (as fidelity_grid_state/run.sh: the parts whose profile carries the sustained runs)
PARTS="33b-s11=fidelity_grid_h200_s11/33b 33b-s13=fidelity_grid_h200_s13/33b-seeds
6.7b-s16=fidelity_grid_h200_s16/6.7b 6.7b-fp8-s16=fidelity_grid_h200_s16/6.7b-fp8 33b-fp8-s16=fidelity_grid_h200_s16/33b-fp8
33b-fp8-s17=fidelity_grid_h200_s17/33b-fp8 6.7b-mixed-s20=fidelity_grid_h200_s20/6.7b-mixed
33b-kvint4-s20=fidelity_grid_h200_s20/33b-kvint4 33b-mixed-s20=fidelity_grid_h200_s20/33b-mixed
6.7b-mixed-s25=fidelity_grid_h200_s25/6.7b-mixed-seeds 6.7b-mixed-s25-4=fidelity_grid_h200_s25/seed4/6.7b-mixed-seeds
33b-mixed-s25-1=fidelity_grid_h200_s25/33b-mixed-1 33b-mixed-s25-2=fidelity_grid_h200_s25/33b-mixed-2
h100-6.7b-fp8-s33=conditioned_s33/h100_6.7b-fp8/6.7b-fp8 h100-6.7b-s34=tiles_s34/h100_6.7b/6.7b"
for kv in ${ONLY:-$PARTS}; do
  name=${kv%%=*}; d=$G/${kv#*=}; p=$(basename "$d")
  A="$d/validate_$p.json $d/decisions_$p.jsonl.gz $d/steps_$p.jsonl.gz --profile $d/profile_$p.json --ceiling 0"
  echo "$(date -u +%H:%M:%S) $name" >&2
  # shellcheck disable=SC2086
  [ -f "$O/${name}_default.json" ] || $PY -m bench.simulator.validate_replay $A --json "$O/${name}_default.json" > /dev/null
  # shellcheck disable=SC2086
  [ -f "$O/${name}_tiles.json" ] || $PY -m bench.simulator.validate_replay $A --mixed-tiles on --decode-tiles 0.22 \
      --json "$O/${name}_tiles.json" > /dev/null
  # shellcheck disable=SC2086
  [ -f "$O/${name}_mixed.json" ] || $PY -m bench.simulator.validate_replay $A --mixed-tiles on --decode-tiles off \
      --json "$O/${name}_mixed.json" > /dev/null
done
