#!/usr/bin/env bash
# Issue 35, session 18 (on an H100: the H200 was not lent): the grid parts this session's H200 calls measured (raw files in ../<part>/),
# scored on the CPU with the committed tools. Run from this folder:
#   PARTS="33b-fp8 33b-kvint4" bash run.sh [replays|tables]   (default all; ~6 min a part on 2 cores)
# replay_<part>_<steps>_<model>.json/txt: validate_replay; <steps> = asrun (the call's own profile) |
#   live (every live step time fed back, a diagnostic); <model> = off (the default simulator) |
#   on_lead (--gateway-loop on --plan-lead live: the s15 opt-in models) | cap (--cap-by-power: s16
#   H35F's power-by-kind cap, r_mix from the profile's sustained_mixed run, measured before the live
#   runs) | cap_lead (both)
# table_<part>_<steps>_<model>.md: fidelity_table of each (the issue's table)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
PARTS=${PARTS:-$(for d in ../*/; do d=${d%/}; d=${d#../}; [ "$d" != analysis ] && echo "$d"; done)}
args() { local p=$1; echo "../$p/validate_$p.json ../$p/decisions_$p.jsonl.gz ../$p/steps_$p.jsonl.gz --profile ../$p/profile_$p.json"; }
flags() { case $1 in off) echo "--gateway-loop off --plan-lead profile" ;;
                         on_lead) echo "--gateway-loop on --plan-lead live" ;;
                         cap) echo "--cap-by-power --gateway-loop off --plan-lead profile" ;;
                         cap_lead) echo "--cap-by-power --gateway-loop on --plan-lead live" ;; esac; }
rp() {  # part steps model
  local p=$1 steps=$2 model=$3 x=""
  [ "$steps" = live ] && x="--live-times"
  # shellcheck disable=SC2046,SC2086
  $PY -m bench.simulator.validate_replay $(args "$p") $x $(flags "$model") \
      --json replay_${p}_${steps}_${model}.json > replay_${p}_${steps}_${model}.txt
}
if [ "$WHAT" = all ] || [ "$WHAT" = replays ]; then
  for p in $PARTS; do
    echo "$(date -u +%H:%M:%S) $p" >&2
    rp "$p" asrun off & rp "$p" asrun on_lead & wait
    rp "$p" asrun cap & rp "$p" asrun cap_lead & wait
    rp "$p" live off
  done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = tables ]; then
  for f in replay_*.json; do
    $PY -m bench.simulator.fidelity_table "$f" > "table_$(basename "${f#replay_}" .json).md"
  done
fi
