#!/usr/bin/env bash
# Issue 32, second H200 call: what bounds the 1.3B preset's batch-1 step, tried. The first call
# (2026-12-04 evening, bench/results/host_cost_h200_s12) found the async loop hides the host
# (device idle 0.010 ms a step at batch 1) and the decode graph itself at 1.41 ms: matmuls on
# cuBLAS 0.93 ms (97 kernels; the weights' floor 0.56 ms), attention 0.35 ms of which the
# split merge is 0.17. Our one-row GEMV has configs for the 33B's shapes only. This call:
#   1. sweeps our GEMV over the 1.3B's shapes (qkv, o, gate_up, down, down with silu fused, LM
#      head; bf16 weights) against cuBLAS           -> $OUT/sweep/, $OUT/tuned_1.3b.json
#   2. bench.engine.steps with those configs: batch-1 decode A/B (cuBLAS vs swept, silu-fused
#      down off/on), the kernel profile of the swept graph, decode batches 1/8/64
#                                                    -> $OUT/steps_tuned.json/.txt
#   3. the same with one attention split per sequence at 512 tokens (TIDEGATE_MIN_TOKENS_PER_SPLIT
#      =1024): does dropping the merge pay?         -> $OUT/steps_split.json/.txt
#   4. `tidegate serve` + `tidegate bench serve`, 16/32 at 2 req/s and 512/128 x 400 at once,
#      with the swept configs (TIDEGATE_GEMV_CONFIGS), and with the split setting too
#                                                    -> $OUT/serving_*.tar.gz (table inside)
#   OUT=$OUT bash scripts/gpu_host_cost_tune_run.sh              # ~300 s on the H200
#   DEVICE=cpu bash scripts/gpu_host_cost_tune_run.sh            # CPU check: steps 4 only, tiny
set -u
OUT=${OUT:-out/gpu_host_cost_tune}
MODEL=${MODEL:-deepseek-coder-1.3b}
DEVICE=${DEVICE:-cuda}
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
TUNED=$OUT/tuned_1.3b.json
if [ "$DEVICE" != cpu ]; then
  timeout -s INT 150 $PY -m bench.kernels.fp8_gemv_sweep --preset "$MODEL" --weights bf16 \
      --shapes qkv,o,gate_up,down,down_silu,lm_head --budget-s 110 --out "$OUT/sweep" \
      --tuned-out "$TUNED" > "$OUT/sweep.txt" 2>&1
  echo "sweep exit $?"; grep -v "^ " "$OUT/sweep.txt" | tail -n 12
  timeout -s INT 100 $PY -m bench.engine.steps --preset "$MODEL" --gemv-configs "$TUNED" --ab \
      --kernel-profile --decode-batches 1,8,64 --prefill-tokens 512 --no-fp8 --no-peer \
      --deadline-s 80 --out "$OUT/steps_tuned.json" > "$OUT/steps_tuned.txt" 2>&1
  echo "steps (swept) exit $?"; grep -E "a/b|^bf16 +(1|8|64) |matmul|attention|rms" "$OUT/steps_tuned.txt" | head -30
  TIDEGATE_MIN_TOKENS_PER_SPLIT=1024 timeout -s INT 70 $PY -m bench.engine.steps --preset "$MODEL" \
      --gemv-configs "$TUNED" --kernel-profile --decode-batches 1,8,64 --prefill-tokens 512 \
      --no-fp8 --no-peer --deadline-s 50 --out "$OUT/steps_split.json" > "$OUT/steps_split.txt" 2>&1
  echo "steps (one split) exit $?"; grep -E "^bf16 +(1|8|64) |merge|paged" "$OUT/steps_split.txt" | head -12
else
  MODEL=tiny; echo '{}' > "$TUNED"
fi
WL=issue32; [ "$DEVICE" = cpu ] && WL=tiny
for variant in swept swept_split; do
  WORK=$OUT/serving_$variant
  export TIDEGATE_GEMV_CONFIGS=$TUNED
  if [ $variant = swept_split ]; then export TIDEGATE_MIN_TOKENS_PER_SPLIT=1024; else unset TIDEGATE_MIN_TOKENS_PER_SPLIT; fi
  only=short_2rps,long_burst; [ "$DEVICE" = cpu ] && only=short_2rps
  timeout -s INT 120 $PY -m bench.serving.suite --out "$WORK" --workloads "$WL" --only "$only" \
      --deadline-s 100 --config "bf16=" -- --model "$MODEL" --load-format dummy --device "$DEVICE"
  echo "serving ($variant) exit $?"
  tar czf "$OUT/serving_$variant.tar.gz" -C "$OUT" "serving_$variant" && rm -rf "$WORK"
done
unset TIDEGATE_GEMV_CONFIGS TIDEGATE_MIN_TOKENS_PER_SPLIT
echo "total $(( $(date +%s) - T0 )) s"
