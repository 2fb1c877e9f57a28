#!/usr/bin/env bash
# Issue 34, session 14: the live CPU run of the prefix-heavy trace (as ../run_live.sh: NB tiny
# backends with 1 torch thread each + one gateway + the load generator, all on this box's cores),
# in each of MODES (off: no --kv-pull; thread: --kv-pull, pulls served off the step loop), fresh
# backends per mode, same seed (SEED). Also records every process's CPU seconds (cpu_MODE.txt:
# /proc/PID/stat utime+stime of each backend and the gateway before they stop, the load
# generator's from /usr/bin/time), which the simulator's --shared-cores model compares against.
# BENCH_ARGS: more `tidegate bench serve` flags (the calibration's --max-concurrency).
#   OUT=... RATE=40 N=600 SEED=0 MODES="off thread" bash bench/results/kv_pull_cpu/cpu_share_s14/run_live.sh
set -u
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-bench/results/kv_pull_cpu/cpu_share_s14/live}
RATE=${RATE:-20}
N=${N:-600}
NB=${NB:-4}
SEED=${SEED:-0}
PORT=${PORT:-18543}
TG=".venv/bin/tidegate"
mkdir -p "$OUT"
uptime > "$OUT/load.txt"
grep -o -w -E 'avx2|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu_flags.txt"
nproc >> "$OUT/cpu_flags.txt"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; pids=(); }
trap cleanup EXIT INT TERM
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) / t}' "/proc/$1/stat" 2>/dev/null || echo nan; }
for mode in ${MODES:-off thread}; do
  socks=()
  bpids=()
  for b in $(seq 0 $((NB - 1))); do
    s=ipc:///tmp/tg-kvshare-$$-$b.sock
    $TG backend --listen "$s" --model tiny --cpu-threads 1 --num-blocks 2048 \
        --step-log "$OUT/steps_${mode}_$b.jsonl" > "$OUT/backend_${mode}_$b.log" 2>&1 &
    pids+=($!)
    bpids+=($!)
    socks+=(--backend "$s")
  done
  flag=()
  [ "$mode" != off ] && flag=(--kv-pull)
  $TG serve "${socks[@]}" "${flag[@]}" --port "$PORT" --startup-timeout 120 \
      > "$OUT/gateway_$mode.log" 2>&1 &
  gpid=$!
  pids+=($gpid)
  for _ in $(seq 1 120); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 1; done
  sleep 2  # every backend introduced
  : > "$OUT/cpu_$mode.txt"
  for p in "${bpids[@]}"; do echo "backend_start $(cpu_s "$p")" >> "$OUT/cpu_$mode.txt"; done
  echo "gateway_start $(cpu_s $gpid)" >> "$OUT/cpu_$mode.txt"
  /usr/bin/time -f "loadgen_user_sys_wall %U %S %e" -a -o "$OUT/cpu_$mode.txt" \
      $TG bench serve --url "http://127.0.0.1:$PORT" --num-requests "$N" --rate "$RATE" \
      --input-len 1088 --output-len 16 --shared-prefix-fraction 1 --shared-prefix-len 1024 \
      --num-prefix-groups 8 --seed "$SEED" --slo-ttft-ms 1000 --slo-tpot-ms 100 \
      --no-progress ${BENCH_ARGS:-} --json "$OUT/live_$mode.json" > "$OUT/live_$mode.txt" 2>&1
  for p in "${bpids[@]}"; do echo "backend_end $(cpu_s "$p")" >> "$OUT/cpu_$mode.txt"; done
  echo "gateway_end $(cpu_s $gpid)" >> "$OUT/cpu_$mode.txt"
  curl -sf "localhost:$PORT/metrics" | grep -E "kv_pull|prefix" > "$OUT/metrics_$mode.txt"
  # the backends' own pull counters (LoadReport)
  eps=()
  for x in "${socks[@]}"; do [ "$x" != --backend ] && eps+=("$x"); done
  timeout 60 .venv/bin/python -m bench.engine.kv_pull --counters "${eps[@]}" \
      > "$OUT/backends_$mode.json" 2>&1
  cleanup
  sleep 2
done
uptime >> "$OUT/load.txt"
gzip -9f "$OUT"/steps_*.jsonl 2>/dev/null
