#!/usr/bin/env bash
# Issue 35, session 27: where does the live mixed step's ~2-3% excess over the paused device-time
# model come from (bench/results/fidelity_onset_s27/README.md)? Two small profiles of the 6.7B
# (dummy weights) on one GPU, ~2 min in all:
#   contiguous: the grid's mixed points (a 256-token chunk beside 0 / 8 / 32 decodes at context
#     705) and the pause check, whose mixed_pattern runs now carry each step's device time: a mixed
#     step run right after other steps against the same step paused (device time both);
#   scattered: the same points with the decodes' KV blocks scattered over the pool, as a long-running
#     engine's free list hands them out: the block layout's share.
# Results under $OUT: contiguous.json, scattered.json, their logs, read.txt (mixed_excess_read.py).
#   run(carry=[".whl"], timeout_s=300, command="OUT0=$OUT; mkdir -p /tmp/M; (OUT=/tmp/M timeout -s INT 270 bash scripts/gpu_mixed_excess_run.sh > /tmp/M/log.txt 2>&1); tar czf $OUT0/M.tar.gz -C /tmp M; tail -30 /tmp/M/log.txt")
set -uo pipefail
: "${OUT:?set OUT}"
MODEL=${MODEL:-deepseek-coder-6.7b}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu MODEL=tiny: a dry run of the commands
source "$(dirname "$0")/gpu_common.sh"  # the repo root, $PY, the carried wheels, $OUT
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?')" | tee -a "$OUT/gpu.txt"
common=(--model "$MODEL" --device "$DEVICE" --decode-batch-sizes 0,8,32 --prefill-tokens 0,256 --context-lens 705
        --packed-prefill-seqs "" --decode-bucket-points off --decode-spread-points off --mixed-spread-points off
        --budget-packed-points off --block-order-check off --pause-ms 60 --repeats 7 --warmup 2)
t0=$(date +%s)
$TG backend profile "${common[@]}" --out "$OUT/contiguous.json" 2>&1 | tee "$OUT/contiguous_log.txt"
echo "contiguous: $(( $(date +%s) - t0 )) s"
# the points only (the pause check's steps lay their blocks out alike whatever the order); SCATTERED=0 skips it
[ "${SCATTERED:-1}" = 1 ] && $TG backend profile "${common[@]}" --pause-ms 60 --kv-block-order scattered --out "$OUT/scattered.json" \
  2>&1 | tee "$OUT/scattered_log.txt"
echo "both: $(( $(date +%s) - t0 )) s"
[ -f bench/results/fidelity_onset_s27/mixed_excess_read.py ] && \
  $PY bench/results/fidelity_onset_s27/mixed_excess_read.py "$OUT/contiguous.json" \
    $( [ -f "$OUT/scattered.json" ] && echo "$OUT/scattered.json" ) | tee "$OUT/read.txt"
