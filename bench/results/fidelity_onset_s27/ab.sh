#!/usr/bin/env bash
# Issue 35, session 27: every committed H200 grid part replayed with the power cap's onset "slow"
# (the default: the sustained trace's one time constant, with the decode-spells term) and "fast"
# (`validate_replay --cap-onset fast`: the limiter's fast onset apart, no decode spell), no ceiling
# (the means and intervals over the seeds; ~3 min on 2 cores), then pooled and counted (score.py).
# Run from the repo root:  bash bench/results/fidelity_onset_s27/ab.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
STATE=$ROOT/bench/results/fidelity_grid_state
eval "$(sed -n '/^declare -A SRC/,/^)/p' "$STATE/run.sh")"
OUTD=${OUTD:-$HERE/replays}
mkdir -p "$OUTD"
for p in ${PARTS:-${!SRC[@]}}; do
  d=$ROOT/bench/results/${SRC[$p]}; n=${SRC[$p]##*/}
  for form in slow fast; do
    $PY -m bench.simulator.validate_replay "$d/validate_$n.json" "$d/decisions_$n.jsonl.gz" "$d/steps_$n.jsonl.gz" \
        --profile "$d/profile_$n.json" --cap-onset $form --json "$OUTD/r_${p}_$form.json" > "$OUTD/r_${p}_$form.txt"
  done
done
$PY "$HERE/score.py" "$OUTD" > "$HERE/score.txt"
cat "$HERE/score.txt"
