#!/usr/bin/env bash
# Issue 35, session 18 (H35W): the power cap's window form against the pause check's sustained trace and the
# live steps right after a prefill step, from the committed H200 parts with a trace (no device time).
# Run from this folder (CPU, ~4 min on 2 cores):   bash run.sh [window|replays|proposal|all]   (default all)
#   window.txt/json      (1) trace vs the model's factor (today, forms A, B); (2) live after-prefill contrast and
#                        H35C's regression per form; (3) which time constant the live steps' slowdown follows
#   replay_<part>_<today|A>.txt/json, table_<part>_<form>.md   validate_replay, today's form and form A
#                        (replay_form.py: the sustained fit's tau replaced by form A's, r unchanged)
#   proposal.txt         the proposed pause-check runs' step counts and device seconds by committed profile
# PY=/path/to/venv/bin/python where the tree has no .venv.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=${ROOT:-$(cd ../../.. && pwd)}
export PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
WHAT=${1:-all}
if [ "$WHAT" = all ] || [ "$WHAT" = window ]; then
  $PY window.py all --json window.json > window.txt
fi
if [ "$WHAT" = all ] || [ "$WHAT" = replays ]; then
  bash replays.sh 2> replays_log.txt
fi
if [ "$WHAT" = all ] || [ "$WHAT" = proposal ]; then
  $PY proposal.py > proposal.txt
fi
