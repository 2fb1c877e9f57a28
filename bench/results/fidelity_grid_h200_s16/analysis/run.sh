#!/usr/bin/env bash
# Issue 35, session 16: the three grid parts this session's H200 calls measured (6.7b, 33b-fp8,
# 6.7b-fp8; raw files in ../<part>/), scored on the CPU with the committed tools. Run from this folder:
#   bash run.sh [replays|steps|tables]   (default all; ~20 min on 2 cores)
# replay_<part>_<steps>_<model>.json/txt: validate_replay; <steps> = asrun (the call's own profile) |
#   live (every live step time fed back, a diagnostic); <model> = off (the default simulator) |
#   on_lead (--gateway-loop on --plan-lead live: the s15 opt-in models, terms from the session's
#   logs) | on_kinds (--gateway-loop on --plan-lead profile-kinds: the leads from the profile)
# table_<part>_<steps>_<model>.md: fidelity_table of each (replay + delivery path, the issue's table)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
args() { local p=$1; echo "../$p/validate_$p.json ../$p/decisions_$p.jsonl.gz ../$p/steps_$p.jsonl.gz --profile ../$p/profile_$p.json"; }
flags() { case $1 in off) echo "--gateway-loop off --plan-lead profile" ;;
                         on_lead) echo "--gateway-loop on --plan-lead live" ;;
                         on_kinds) echo "--gateway-loop on --plan-lead profile-kinds" ;; esac; }
rp() {  # part steps model
  local p=$1 steps=$2 model=$3 x=""
  [ "$steps" = live ] && x="--live-times"
  # shellcheck disable=SC2046,SC2086
  $PY -m bench.simulator.validate_replay $(args "$p") $x $(flags "$model") \
      --json replay_${p}_${steps}_${model}.json > replay_${p}_${steps}_${model}.txt
}
if [ "$WHAT" = all ] || [ "$WHAT" = replays ]; then
  for p in 6.7b 6.7b-fp8 33b-fp8; do
    rp "$p" asrun off & rp "$p" asrun on_lead & wait
    rp "$p" asrun on_kinds & rp "$p" live off & wait
    rp "$p" live on_lead
  done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = tables ]; then
  for f in replay_*.json; do
    $PY -m bench.simulator.fidelity_table "$f" > "table_${f#replay_}"; mv "table_${f#replay_}" "table_$(basename "${f#replay_}" .json).md"
  done
fi
