#!/usr/bin/env bash
# Issue 31, tenth session: ttft placement's near-tie rule, load vs hash, in the simulator on the
# fidelity runs' setting (4 paced-echo-like backends, 20 ms constant step, 8 seqs, 600 ms windows,
# Fast-first backends, slot model), 0.5x / 1.0x / 1.5x, seeds 0-9. One JSON per run under $OUT.
OUT=${OUT:-/tmp/i31_grid}; mkdir -p "$OUT"
for tie in ${TIES:-load hash}; do for rate in 15.9 31.9 47.8; do for seed in $(seq 0 ${SEEDS_LAST:-9}); do
  .venv/bin/tidegate sim slo --step-ms 20 --placement ttft --placement-tie-break $tie --placement-ttft-tolerance ${TOL:-0.1} --seed $seed \
    --target-throughput 1 --min-latency-ms 600 --no-idle-flush --max-num-seqs 8 --waiting-by-class \
    --slot-model --backends 4 --max-backends 4 --rate $rate --num-requests 600 --input-len 32 \
    --output-len uniform:1:80 --slo-ttft-ms fast=750,normal=1000,slow=1600 --attainment 0.99 \
    ${EXTRA:-} --json "$OUT/${tie}_${rate}_${seed}.json" > /dev/null 2>&1
done; done; done
