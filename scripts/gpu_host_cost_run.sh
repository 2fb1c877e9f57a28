#!/usr/bin/env bash
# Issue 32 on one H200, in one device call: the host cost per step of the 1.3B preset
# (deepseek-coder-1.3b, dummy bf16 weights), where the async loop must keep the device busy.
#
#   OUT=$OUT bash scripts/gpu_host_cost_run.sh              # everything under $OUT (default out/gpu_host_cost)
#   DEVICE=cpu MODEL=tiny WORKLOADS=tiny bash scripts/gpu_host_cost_run.sh   # CPU check of the plumbing
#
# 1. pytest: the device-idle bookkeeping (CPU stand-ins) and the async/overlap engine tests, GPU
#    ones included (-m "gpu or not gpu"), TEST_S cap.                      -> $OUT/pytest.txt
# 2. bench.engine.host_loop: sync vs async loop at batch 1 and 64, device idle between steps from
#    CUDA events around each replay.                                       -> $OUT/host_loop.json
# 3. bench.engine.steps --kernel-profile: decode graph times at batch 1/8/64 and the per-kernel
#    GPU times of the batch-1 decode graph (what bounds a graph step).     -> $OUT/engine_steps.json
# 4. bench.serving.suite --workloads issue32 (`tidegate serve` + `tidegate bench serve`): 16/32 at
#    2 req/s (40), 16/32 x 256 at once, 512/128 at 32 req/s (400), 512/128 x 400 at once; the step
#    log of the same run beside each (device_ms, device_idle_ms per step: CUDA events), the goals
#    table (ITL p50 <= 1.0 ms at batch 1, device idle <= 10% at batch ~64, burst within 15% of the
#    step times).                                 -> $OUT/serving_table.md, summary.json, tarball
# Environment: MODEL (deepseek-coder-1.3b), DEVICE (cuda), WORKLOADS (issue32), TOTAL_S (550: the
# whole call; the suite gets what is left, at least 240 s), TEST_S (60), STEPS_S (70). pyzmq/aiohttp missing: carry .whl (gpu_common.sh installs them).
set -u
OUT=${OUT:-out/gpu_host_cost}
MODEL=${MODEL:-deepseek-coder-1.3b}
DEVICE=${DEVICE:-cuda}
WORKLOADS=${WORKLOADS:-issue32}
TOTAL_S=${TOTAL_S:-550}
TEST_S=${TEST_S:-60}
STEPS_S=${STEPS_S:-70}
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)

{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
  nproc; grep -m1 'model name' /proc/cpuinfo
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if $PY -c 'import pytest' 2>/dev/null; then
  timeout -s INT "$TEST_S" $PY -m pytest -q -rfEs -p no:cacheprovider -m "gpu or not gpu" \
      tests/test_device_idle.py tests/test_engine_async.py tests/test_engine_overlap.py \
      > "$OUT/pytest.txt" 2>&1
  echo "pytest exit $?"; tail -n 3 "$OUT/pytest.txt"
fi

if [ "$DEVICE" != cpu ]; then
  timeout -s INT 80 $PY -m bench.engine.host_loop --model "$MODEL" --device "$DEVICE" \
      --batches 1,64 --context 512 --steps 60 --json "$OUT/host_loop.json" > "$OUT/host_loop.txt" 2>&1
  echo "host_loop exit $?"; tail -n 8 "$OUT/host_loop.txt"
  timeout -s INT $((STEPS_S + 20)) $PY -m bench.engine.steps --preset "$MODEL" --kernel-profile \
      --decode-batches 1,8,64 --prefill-tokens 512,2048 --no-fp8 --no-peer \
      --deadline-s "$STEPS_S" --out "$OUT/engine_steps.json" > "$OUT/engine_steps.txt" 2>&1
  echo "engine steps exit $?"; tail -n 25 "$OUT/engine_steps.txt"
fi

WORK=$OUT/serving_work
LEFT=$(( TOTAL_S - ($(date +%s) - T0) ))  # the suite's cap: what is left of the call
[ "$LEFT" -lt 240 ] && LEFT=240
timeout -s INT "$LEFT" $PY -m bench.serving.suite --out "$WORK" --workloads "$WORKLOADS" \
    --deadline-s $((LEFT - 60)) --config "bf16=" \
    -- --model "$MODEL" --load-format dummy --device "$DEVICE" "$@"
echo "serving suite exit $?"
cp "$WORK/serving_table.md" "$WORK/summary.json" "$OUT/" 2>/dev/null
tar czf "$OUT/serving_results.tar.gz" -C "$OUT" serving_work && rm -rf "$WORK"
echo "total $(( $(date +%s) - T0 )) s"
