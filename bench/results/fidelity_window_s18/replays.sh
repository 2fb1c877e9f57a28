#!/usr/bin/env bash
# the replays of window.py's form A beside today's form (the part's own default), one at a time
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
G=..
# part -> folder and form A's tau (s), from window.txt / window.json (trace fit through the model's factor)
declare -A SRC=([6.7b-s16]=fidelity_grid_h200_s16/6.7b [33b-fp8-s16]=fidelity_grid_h200_s16/33b-fp8
                [33b-fp8-s17]=fidelity_grid_h200_s17/33b-fp8)
PARTS=${PARTS:-"6.7b-s16 33b-fp8-s16 33b-fp8-s17"}
for p in $PARTS; do
  d=$G/${SRC[$p]}; t=${SRC[$p]##*/}
  A=(validate_$t.json decisions_$t.jsonl.gz steps_$t.jsonl.gz)
  args="$d/${A[0]} $d/${A[1]} $d/${A[2]} --profile $d/profile_$t.json"
  tau=$($PY -c "import json;print(json.load(open('window.json'))['trace']['$p']['forms']['A']['comps'][0][0])")
  echo "$(date -u +%H:%M:%S) $p today" >&2
  # shellcheck disable=SC2086
  $PY -m bench.simulator.validate_replay $args --json "replay_${p}_today.json" > "replay_${p}_today.txt"
  echo "$(date -u +%H:%M:%S) $p form A tau $tau" >&2
  # shellcheck disable=SC2086
  $PY replay_form.py --tau-s "$tau" -- $args --json "replay_${p}_A.json" > "replay_${p}_A.txt"
  for f in today A; do $PY -m bench.simulator.fidelity_table "replay_${p}_$f.json" > "table_${p}_$f.md"; done
done
echo "$(date -u +%H:%M:%S) done" >&2
