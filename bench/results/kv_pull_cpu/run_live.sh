#!/usr/bin/env bash
# Issue 34's live CPU run: 4 tiny backends (1 torch thread each) behind one gateway, the prefix-heavy
# trace of `python -m sims.kv_pull_study pull` (8 tenants x 1,024-token prefixes + 64-token
# questions, 16 tokens out) at RATE req/s, in each of MODES (default "off loop thread"):
#   off     no --kv-pull
#   loop    --kv-pull, backends answer pulls between their steps (--kv-pull-serve loop: 1.3)
#   thread  --kv-pull, backends answer pulls off their step loop and land their own before their
#           next step (--kv-pull-serve thread, the default since 2026-12-04)
# (before 2026-12-04 the modes were "off on", "on" = today's loop). Fresh backends for each run
# (the same arrivals and prompts: same seed), each with a step log (the simulator's slowdown).
#   bash bench/results/kv_pull_cpu/run_live.sh            # OUT=bench/results/kv_pull_cpu/live
set -u
cd "$(dirname "$0")/../../.." || exit 1
OUT=${OUT:-bench/results/kv_pull_cpu/live}
RATE=${RATE:-20}
N=${N:-600}
TG=".venv/bin/tidegate"
mkdir -p "$OUT"
uptime > "$OUT/load.txt"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; pids=(); }
trap cleanup EXIT INT TERM
for mode in ${MODES:-off loop thread}; do
  socks=()
  serve=thread
  [ $mode = loop ] && serve=loop
  for b in 0 1 2 3; do
    s=ipc:///tmp/tg-kvlive-$$-$b.sock
    $TG backend --listen "$s" --model tiny --cpu-threads 1 --num-blocks 2048 \
        --kv-pull-serve $serve --step-log "$OUT/steps_${mode}_$b.jsonl" \
        > "$OUT/backend_${mode}_$b.log" 2>&1 &
    pids+=($!)
    socks+=(--backend "$s")
  done
  flag=()
  [ $mode != off ] && flag=(--kv-pull)
  $TG serve "${socks[@]}" "${flag[@]}" --port 18541 --startup-timeout 120 \
      > "$OUT/gateway_$mode.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 120); do curl -sf localhost:18541/health >/dev/null && break; sleep 1; done
  sleep 2  # every backend introduced
  $TG bench serve --url http://127.0.0.1:18541 --num-requests "$N" --rate "$RATE" \
      --input-len 1088 --output-len 16 --shared-prefix-fraction 1 --shared-prefix-len 1024 \
      --num-prefix-groups 8 --seed 0 --slo-ttft-ms 1000 --slo-tpot-ms 100 \
      --no-progress --json "$OUT/live_$mode.json" > "$OUT/live_$mode.txt" 2>&1
  curl -sf localhost:18541/metrics | grep -E "kv_pull|prefix" > "$OUT/metrics_$mode.txt"
  # the backends' own pull counters (LoadReport)
  eps=()
  for x in "${socks[@]}"; do [ "$x" != --backend ] && eps+=("$x"); done
  timeout 60 .venv/bin/python -m bench.engine.kv_pull --counters "${eps[@]}" \
      > "$OUT/backends_$mode.json" 2>&1
  cleanup
  sleep 2
done
uptime >> "$OUT/load.txt"
gzip -9f "$OUT"/steps_*.jsonl 2>/dev/null  # sims.kv_pull_study --slowdown-from reads them so
