#!/usr/bin/env bash
# Issue 35, session 29: score the H100 6.7B FP8 part (../fidelity_h100fp8_s29/6.7b-fp8) on the CPU, run from this folder:
#   bash run.sh
# replay_<form>.json / .txt: validate_replay with the simulator's default (default), the cap's ratios from the
# stream_kind runs (stream: --cap-anchors stream), that with the fast onset (stream_fast), and every live step time fed
# back (live: the ceiling of what step times alone fix); table_<form>.md: fidelity_table of each;
# decode_exact.txt: the live decode-only steps against the profile by exact d (decode_exact.py).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../../.. && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
P=6.7b-fp8
A="$P/validate_$P.json $P/decisions_$P.jsonl.gz $P/steps_$P.jsonl.gz --profile $P/profile_$P.json"
rp() {  # form flags...
  local f=$1; shift
  # shellcheck disable=SC2086
  $PY -m bench.simulator.validate_replay $A "$@" --json replay_$f.json > replay_$f.txt
  $PY -m bench.simulator.fidelity_table replay_$f.json > table_$f.md
}
rp default & rp stream --cap-anchors stream & wait
rp stream_fast --cap-anchors stream --cap-onset fast & rp live --live-times & wait
$PY decode_exact.py "$P" > decode_exact.txt
$PY ../fidelity_sag_s28/stream_read.py "$P/profile_$P.json" > stream_read.txt
