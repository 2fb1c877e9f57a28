#!/usr/bin/env bash
# HTTP requests/s through `tidegate serve --workers N` at concurrency 64, N = 1 and 2 alternating,
# against one echo backend (no model: the gateway's own cost). Usage:
#   bash scripts/bench_workers.sh [REPEATS=2] [NUM_REQUESTS=3000]
# PIN=1: each gateway worker is pinned to a core of its own (worker i to core i mod ncores; the
# load generator and the backend float). Beside each figure: the machine's idle share during
# the run (/proc/stat) and the CPU seconds per request of the gateway processes, the backend and
# the load generator, which say whether a core was left for a second worker to use.
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${1:-2}
N=${2:-3000}
TG=${TG:-.venv/bin/tidegate}
PIN=${PIN:-0}
OUT=${OUT:-/tmp/tg-workers}
NCPU=$(nproc)
mkdir -p "$OUT"
SOCK="ipc://$OUT/echo.sock"
$TG backend --model echo --listen "$SOCK" > "$OUT/echo.log" 2>&1 &
ECHO=$!
trap 'kill $ECHO 2>/dev/null || true' EXIT
until grep -q "ready" "$OUT/echo.log"; do sleep 0.5; done
cpu_s() { # user+system seconds of the given pids (0 for one that is gone)
  local t=0 p
  for p in "$@"; do
    [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat)))
  done
  echo "$t"
}
idle_jiffies() { awk '/^cpu /{print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
for r in $(seq "$REPEATS"); do
  for W in 1 2; do
    PORT=$((18300 + W))
    $TG serve --backend "$SOCK" --port $PORT --workers $W --log-level warning > "$OUT/serve_$W.log" 2>&1 &
    SERVE=$!
    until [ "$(grep -c 'tidegate serving' "$OUT/serve_$W.log" || true)" -ge "$W" ]; do sleep 0.5; done
    sleep 2  # every worker's backend connection is up
    GW="$SERVE $(pgrep -P $SERVE | tr '\n' ' ' || true)"
    if [ "$PIN" = 1 ]; then
      i=0
      for p in $( [ "$W" = 1 ] && echo $SERVE || pgrep -P $SERVE); do
        taskset -a -p -c $((i % NCPU)) "$p" > /dev/null; i=$((i + 1))
      done
    fi
    read -r idle0 total0 < <(idle_jiffies)
    gw0=$(cpu_s $GW); be0=$(cpu_s $ECHO)
    $TG bench serve --url "http://127.0.0.1:$PORT" --num-requests "$N" --rate inf \
        --max-concurrency 64 --input-len 16 --output-len 4 --json "$OUT/w${W}_r$r.json" > /dev/null &
    LG=$!
    lg=0
    while kill -0 $LG 2>/dev/null; do lg=$(cpu_s $LG); sleep 0.2; done
    wait $LG || true
    read -r idle1 total1 < <(idle_jiffies)
    gw1=$(cpu_s $GW); be1=$(cpu_s $ECHO)
    kill -TERM $SERVE; wait $SERVE || true
    python3 -c "
import json; d = json.load(open('$OUT/w${W}_r$r.json')); hz = 100; n = $N
print('workers $W run $r: %.1f req/s, machine idle %.0f%%, CPU us/request: gateway %.0f, '
      'backend %.0f, load generator >= %.0f, load average %s' % (d.get('request_throughput', float('nan')),
      100 * ($idle1 - $idle0) / max(1, $total1 - $total0), ($gw1 - $gw0) / hz / n * 1e6,
      ($be1 - $be0) / hz / n * 1e6, $lg / hz / n * 1e6, open('/proc/loadavg').read().split()[0]))"
  done
done
