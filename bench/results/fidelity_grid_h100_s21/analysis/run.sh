#!/usr/bin/env bash
# Issue 35, session 21 (copied from ../../fidelity_grid_h200_s20/analysis/run.sh, itself copied from ../../fidelity_spread_s19/score_part_run.sh): the scoring script for this
# session's grid parts with the unequal-contexts term. Copy it to <session folder>/analysis/run.sh beside
# the parts' raw files (../<part>/),
# scored on the CPU with the committed tools. Run from this folder:
#   PARTS="6.7b-mixed" bash run.sh [replays|tables]   (default all; ~2 min a part on 2 cores)
# replay_<part>_<steps>_<model>.json/txt: validate_replay; <steps> = asrun (the call's own profile) |
#   live (every live step time fed back, a diagnostic); <model> = default (the grid state's form: the
#   gateway loop, the measured plan leads, --cap-by-power, and the unequal-contexts term at the kappa
#   the profile's spread points measured) | nospread (the same with --decode-spread off: the model
#   before session 19) | nocap (the default without --cap-by-power)
# table_<part>_<steps>_<model>.md: fidelity_table of each (the issue's table);
# bins_<part>.txt: ../../fidelity_spread_s19/spread_bins.py with the measured kappa and 2.5
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
PARTS=${PARTS:-$(for d in ../*/; do d=${d%/}; d=${d#../}; if [ "$d" != analysis ]; then echo "$d"; fi; done)}
args() { local p=$1; echo "../$p/validate_$p.json ../$p/decisions_$p.jsonl.gz ../$p/steps_$p.jsonl.gz --profile ../$p/profile_$p.json"; }
flags() { case $1 in default) echo "--cap-by-power --gateway-loop on --plan-lead live" ;;
                         nospread) echo "--cap-by-power --gateway-loop on --plan-lead live --decode-spread off" ;;
                         nocap) echo "--gateway-loop on --plan-lead live" ;; esac; }
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
    rp "$p" asrun default & rp "$p" asrun nospread & wait
    rp "$p" asrun nocap & rp "$p" live default & wait
    $PY ../../fidelity_spread_s19/spread_bins.py ../$p measured 2.5 > bins_$p.txt
  done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = tables ]; then
  for f in replay_*.json; do
    $PY -m bench.simulator.fidelity_table "$f" > "table_$(basename "${f#replay_}" .json).md"
  done
fi
