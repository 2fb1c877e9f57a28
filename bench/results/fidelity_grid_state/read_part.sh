#!/usr/bin/env bash
# Issue 35 (session 31): read one new grid part on the CPU, run from the repo root:
#   bash bench/results/fidelity_grid_state/read_part.sh PART_DIR
# Writes beside the part (PART_DIR/read/): validate_replay in the simulator's default form (default), with the cap's
# anchors from the profile's stream_kind runs (stream), that with the fast onset (stream_fast), with every live
# step time fed back (live: the most step times can give), each with its fidelity table; the decode-only steps
# against the profile by exact d (decode_exact), by d's place in its graph bucket (bucket_excess), fitted by the
# profile pass that priced each d (by_pass: c + e w(d), e the decode-bucket points' shortfall, session 32) and split by the
# SM clock (decode_exact_clock); the profile's long stream_mixed run (stream_read); its fill and block-order check;
# with whole tiles beside a chunk (mixed_tiles; with the stream anchors, stream_tiles; at the profile's measured
# fractions of a tile, stream_measured, tile_fractions.txt) and the busy mixed steps by chunk start and d (mixed_read);
# since session 40 the busy level (spin, stream_spin) and the steps with prefill in each form (spin_level_whatif);
# since session 41 the delayed onset (delay) and the steps by their place in a run of steps with prefill (burst_place).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
D=$(cd "$1" && pwd); P=$(basename "$D")
R=$D/read; mkdir -p "$R"
A="$D/validate_$P.json $D/decisions_$P.jsonl.gz $D/steps_$P.jsonl.gz --profile $D/profile_$P.json"
rp() {  # form flags...
  local f=$1; shift
  # shellcheck disable=SC2086
  $PY -m bench.simulator.validate_replay $A "$@" --json "$R/replay_$f.json" > "$R/replay_$f.txt"
  $PY -m bench.simulator.fidelity_table "$R/replay_$f.json" > "$R/table_$f.md"
}
S=$ROOT/bench/results
$PY "$S/fidelity_h100fp8_s29/decode_exact.py" "$D" > "$R/decode_exact.txt"
$PY "$S/fidelity_h100_s31/bucket_excess.py" "$R/decode_exact.txt" "$D/profile_$P.json" > "$R/bucket_excess.txt"
$PY "$S/decode_same_machine_s32/read_by_pass.py" "$D/profile_$P.json" "$R/decode_exact.txt" > "$R/by_pass.txt"
$PY "$S/fidelity_h100fp8_s29/decode_exact_clock.py" "$D" > "$R/decode_exact_clock.txt"
$PY "$S/fidelity_sag_s28/stream_read.py" "$D/profile_$P.json" > "$R/stream_read.txt"
$PY - "$D/profile_$P.json" > "$R/profile_checks.txt" <<'PYEOF'
import json, sys
doc = json.load(open(sys.argv[1]))
print("kv_fill:", doc.get("kv_fill"), "| device:", doc.get("device_name"), "| kv:", doc.get("kv_cache_dtype"))
boc = doc.get("block_order_check")
print("block_order_check:", json.dumps(boc, indent=1)[:3000] if boc else None)
runs = [r.get("run") for r in (doc.get("pause_check") or {}).get("runs", [])]
print("pause_check runs:", runs)
PYEOF
rp default & rp stream --cap-anchors stream & wait
rp stream_fast --cap-anchors stream --cap-onset fast & rp live --live-times & wait
rp mixed_tiles --mixed-tiles on  # session 33: the decodes beside a chunk at their whole tiles (opt-in term)
# session 34: with the stream anchors too (the H100 cells' 15 / 15), and each tiles term at the fractions the
# profile's off-edge points measure (--tile-edge-points; none on a profile made before them: then as default)
rp stream_tiles --cap-anchors stream --mixed-tiles on &
rp stream_measured --cap-anchors stream --mixed-tiles measured --decode-tiles measured & wait
$PY -c "import sys; from sims.profile_cost import ProfileCost; print(ProfileCost.from_json(sys.argv[1]).tile_fractions)" \
    "$D/profile_$P.json" > "$R/tile_fractions.txt"
$PY "$S/conditioned_s33/mixed_read.py" "$D" > "$R/mixed_read.txt"
# session 40: the busy level (--decode-spells spin; as the default where the profile has no no-pause timing) and
# with the stream anchors; the steps with prefill per run in each form (spin_level_whatif.txt)
rp spin --decode-spells spin & rp stream_spin --cap-anchors stream --decode-spells spin & wait
$PY "$S/pairs_s40/spin_level_whatif.py" "$D" > "$R/spin_level_whatif.txt"
# session 41: the delayed onset (--cap-onset delay; as the default where the profile lacks its runs), and the busy
# steps with prefill by their place in a run of such steps back to back, in each form (prediction 39's premise)
rp delay --cap-onset delay
$PY "$S/pairs_s41/burst_place.py" "$D" > "$R/burst_place.txt"
echo "read: $R"
