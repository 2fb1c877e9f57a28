#!/usr/bin/env bash
# Issue 35, session 34: every H100 part with the profile's stream runs, replayed with the cap's anchors from them
# (--cap-anchors stream) without and with whole tiles beside a chunk (--mixed-tiles on), and both tile terms
# with decode-only steps charged 0.31 of a tile (--decode-tiles 0.31: the bf16 check's median on the card,
# fractions_bf16.txt; a what-if until a profile measures it) with and without the stream anchors; writes stream_tiles/
# <part>_<form>.{txt,md} and prints each table's intervals and means inside the bound to 0.95x. ~2.5 min on 2 cores.
#   bash bench/results/tiles_s34/stream_tiles.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd); cd "$ROOT"
PY=${PY:-.venv/bin/python}; export PYTHONPATH=$ROOT
O=bench/results/tiles_s34/stream_tiles; T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
for D in bench/results/tiles_s34/h100_6.7b/6.7b bench/results/conditioned_s33/h100_6.7b-fp8/6.7b-fp8 \
         bench/results/fidelity_h100_s31/6.7b bench/results/fidelity_h100_s31/6.7b-fp8; do
  P=$(basename "$D"); n=$(echo "$D" | cut -d/ -f3)_$P
  for form in "stream:--cap-anchors stream" "stream_tiles:--cap-anchors stream --mixed-tiles on" \
              "tiles_dec:--mixed-tiles on --decode-tiles 0.31" \
              "stream_tiles_dec:--cap-anchors stream --mixed-tiles on --decode-tiles 0.31"; do
    f=${form%%:*}; fl=${form#*:}
    # shellcheck disable=SC2086
    $PY -m bench.simulator.validate_replay "$D/validate_$P.json" "$D/decisions_$P.jsonl.gz" "$D/steps_$P.jsonl.gz" \
        --profile "$D/profile_$P.json" $fl --json "$T/r.json" > "$O/${n}_$f.txt"
    $PY -m bench.simulator.fidelity_table "$T/r.json" > "$O/${n}_$f.md"
    echo "== $n $f"
    $PY - "$O/${n}_$f.md" <<'PYEOF'
import sys
bounds = (5, 10, 5, 10, 2)  # TTFT P50, P99, TPOT P50, P99, throughput (%)
inside = means = total = 0
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.split("|")[1:-1]]
    if len(c) < 13 or c[5] not in ("0.5x", "0.8x", "0.95x"):
        continue
    for cell, b in zip(c[6:11], bounds):
        total += 1
        inside += cell.startswith("**")
        means += abs(float(cell.strip("*").split("±")[0])) <= b
    print(f"  {c[5]:5s} " + " | ".join(c[6:11]) + f" | chunks {c[12]}")
print(f"  intervals inside {inside}/{total}, means inside {means}/{total}")
PYEOF
  done
done
