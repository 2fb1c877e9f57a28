#!/usr/bin/env bash
# HTTP requests/s through `tidegate serve --workers N` at concurrency 64, N = 1 and 2 alternating,
# against one echo backend (no model: the gateway's own cost). Usage:
#   bash scripts/bench_workers.sh [REPEATS=2] [NUM_REQUESTS=3000]
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${1:-2}
N=${2:-3000}
TG=.venv/bin/tidegate
OUT=${OUT:-/tmp/tg-workers}
mkdir -p "$OUT"
SOCK="ipc://$OUT/echo.sock"
$TG backend --model echo --listen "$SOCK" > "$OUT/echo.log" 2>&1 &
ECHO=$!
trap 'kill $ECHO 2>/dev/null || true' EXIT
until grep -q "ready" "$OUT/echo.log"; do sleep 0.5; done
for r in $(seq "$REPEATS"); do
  for W in 1 2; do
    PORT=$((18300 + W))
    $TG serve --backend "$SOCK" --port $PORT --workers $W --log-level warning > "$OUT/serve_$W.log" 2>&1 &
    SERVE=$!
    until [ "$(grep -c 'tidegate serving' "$OUT/serve_$W.log" || true)" -ge "$W" ]; do sleep 0.5; done
    sleep 2  # every worker's backend connection is up
    $TG bench serve --url "http://127.0.0.1:$PORT" --num-requests "$N" --rate inf \
        --max-concurrency 64 --input-len 16 --output-len 4 --json "$OUT/w${W}_r$r.json" > /dev/null
    kill -TERM $SERVE; wait $SERVE || true
    python3 -c "import json,sys; d=json.load(open('$OUT/w${W}_r$r.json')); print('workers $W run $r: %.1f req/s' % d.get('request_throughput', float('nan')))"
  done
done
