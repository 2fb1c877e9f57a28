#!/usr/bin/env bash
# Issue 35, session 35: the tiles forms at the fractions the profile's tile-edge pairs measure (read with the
# code at HEAD: ProfileCost.set_tile_pairs), beside read_part.sh's forms, for each part dir given; then counts.
#   bash bench/results/tiles_s35/forms.sh PART_DIR...
# Writes PART_DIR/read/{replay,table}_<form>.* for: tiles_measured (both tiles terms measured, the default anchors),
# stream_measured (the same with the stream anchors; read_part.sh's, redone at HEAD), tile_fractions.txt; and
# forms.txt (count_forms.py over every table in read/).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd); cd "$ROOT"
PY=${PY:-.venv/bin/python}; export PYTHONPATH=$ROOT
for D in "$@"; do
  D=$(cd "$D" && pwd); P=$(basename "$D"); R=$D/read; mkdir -p "$R"
  A="$D/validate_$P.json $D/decisions_$P.jsonl.gz $D/steps_$P.jsonl.gz --profile $D/profile_$P.json"
  rp() { local f=$1; shift
    # shellcheck disable=SC2086
    $PY -m bench.simulator.validate_replay $A "$@" --json "$R/replay_$f.json" > "$R/replay_$f.txt"
    $PY -m bench.simulator.fidelity_table "$R/replay_$f.json" > "$R/table_$f.md"; }
  rp tiles_measured --mixed-tiles measured --decode-tiles measured &
  rp stream_measured --cap-anchors stream --mixed-tiles measured --decode-tiles measured & wait
  $PY -c "import sys; from sims.profile_cost import ProfileCost; print(ProfileCost.from_json(sys.argv[1]).tile_fractions)" \
      "$D/profile_$P.json" > "$R/tile_fractions.txt"
  $PY bench/results/tiles_s35/count_forms.py "$R" > "$R/forms.txt"
  echo "== $P $(cat "$R/tile_fractions.txt")"; cat "$R/forms.txt"
done
