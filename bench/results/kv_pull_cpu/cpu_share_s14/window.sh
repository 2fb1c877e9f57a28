#!/usr/bin/env bash
# The session's live runs, one after another: each argument is RATE:SEED:MODES (MODES with '+'
# for spaces, e.g. 60:1:thread+off), into bench/results/kv_pull_cpu/cpu_share_s14/rRATE_sSEED_MODES/.
#   bash bench/results/kv_pull_cpu/cpu_share_s14/window.sh 40:0:off 50:0:off 60:0:off ...
set -u
cd "$(dirname "$0")" || exit 1
here=$(pwd)
N=${N:-900}
for item in "$@"; do
  IFS=: read -r rate seed modes <<< "$item"
  out="$here/r${rate}_s${seed}_${modes//+/_}"
  echo "$(date -u +%T) start $item -> $out  load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/window.log"
  OUT="$out" RATE="$rate" N="$N" SEED="$seed" MODES="${modes//+/ }" bash "$here/run_live.sh"
  for m in ${modes//+/ }; do
    g=$(python3 -c "import json; print(round(100 * json.load(open('$out/live_$m.json'))['goodput_fraction'], 1))" 2>/dev/null)
    echo "$(date -u +%T)   $m goodput $g%" >> "$here/window.log"
  done
done
