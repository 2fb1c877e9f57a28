#!/usr/bin/env bash
# Issue 35, session 25: the decode-spells term (sims.profile_cost, "Decode spells", inside the opt-in
# --cap-by-power) against the pattern check's reading on this session's 33B bf16 profile
# (pattern_check.txt: the mixed step with 1 / 3 decode steps between reads 1.034 / 0.997 x paused;
# the term charges 1.137 / 1.111, the weights without it 1.077 / 1.006). Every grid part whose
# profile has the sustained mixed run, replayed with --cap-by-power and --decode-spells off, beside
# the cap form with the term (cap) and the model without the weights (nocap: the simulator's default
# before this session, which made the cap form the default where the profile has the run).
# No --ceiling (the latency figures do not depend on it). Run from this folder (~1-3 min a part, 2 cores):
#   bash spells.sh [FORMS]    FORMS: nocap cap cap_nospells (all three by default); PARTS="..." for some
# cap_nomixedspread (not by default): the cap form without the mixed steps' spread term (--mixed-spread
# off), the term's first H200 reading (this session's profiles are the first H200 ones with mixed spread
# points): PARTS="6.7b-mixed-s25 6.7b-mixed-s25-4 33b-mixed-s25-1 33b-mixed-s25-2" bash spells.sh cap_nomixedspread
# then: python spells_table.py > spells_table.md
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
G=../..
declare -A SRC=(
  [33b-fp8-s17]=fidelity_grid_h200_s17/33b-fp8
  [6.7b-mixed-s20]=fidelity_grid_h200_s20/6.7b-mixed
  [33b-kvint4-s20]=fidelity_grid_h200_s20/33b-kvint4
  [33b-mixed-s20]=fidelity_grid_h200_s20/33b-mixed
  [6.7b-mixed-s25]=fidelity_grid_h200_s25/6.7b-mixed-seeds
  [6.7b-mixed-s25-4]=fidelity_grid_h200_s25/seed4/6.7b-mixed-seeds
  [33b-mixed-s25-1]=fidelity_grid_h200_s25/33b-mixed-1
  [33b-mixed-s25-2]=fidelity_grid_h200_s25/33b-mixed-2
)
PARTS=${PARTS:-"33b-mixed-s25-1 33b-mixed-s25-2 33b-mixed-s20 33b-kvint4-s20 33b-fp8-s17 6.7b-mixed-s25-4 6.7b-mixed-s20 6.7b-mixed-s25"}
FORMS=${*:-nocap cap cap_nospells}
flags() { case $1 in nocap) echo "--cap-by-power off" ;; cap) echo "--cap-by-power on" ;;
                     cap_nospells) echo "--cap-by-power on --decode-spells off" ;;
                     cap_nomixedspread) echo "--cap-by-power on --mixed-spread off" ;; esac; }
for p in $PARTS; do
  d=$G/${SRC[$p]} n=${SRC[$p]##*/}
  for form in $FORMS; do
    echo "$(date -u +%H:%M:%S) $p $form" >&2
    # shellcheck disable=SC2046
    $PY -m bench.simulator.validate_replay "$d/validate_$n.json" "$d/decisions_$n.jsonl.gz" "$d/steps_$n.jsonl.gz" \
        --profile "$d/profile_$n.json" $(flags "$form") --json "replay_${p}_${form}.json" > "replay_${p}_${form}.txt"
  done
done
