#!/bin/bash
# The trade-off curve (issue 31, fifth session): admission's outcome over workload seeds 0-9
# (`tidegate sim retry-bound --outcome-seeds 10`, no worlds) per setting of the Slow requests'
# projection of the higher classes' arrivals, at 1.0x, 1.5x and 2.0x the benchmark's capacity.
# Run from the repository root: bash bench/results/slo_admission_misses_s5/curve.sh
set -eu
D=bench/results/slo_admission_misses_s5/curve
mkdir -p "$D"
B="--step-ms 20 --placement ttft --max-num-seqs 8 --waiting-by-class --slot-model --backends 4
   --num-requests 600 --input-len 32 --output-len uniform:1:80
   --slo-ttft-ms fast=150,normal=400,slow=1000 --outcome-seeds 10"
for rate in 31.9 47.8 63.7; do
  for cfg in arrival_quantile=none \
      arrival_quantile_mode=path,arrival_quantile=0.5 arrival_quantile_mode=path,arrival_quantile=0.7 \
      arrival_quantile_mode=path,arrival_quantile=0.9 arrival_quantile_mode=path,arrival_quantile=0.95 \
      arrival_quantile_mode=path,arrival_quantile=0.99 \
      arrival_quantile=0.8 arrival_quantile=0.9 arrival_quantile=0.95 arrival_quantile=0.97 \
      arrival_quantile=0.99 arrival_quantile=0.99,arrival_quantile_from=1; do
    name=$(echo "$cfg" | tr ',=' '_-')
    .venv/bin/tidegate sim retry-bound $B --rate "$rate" --admission-config "$cfg" \
        --json "$D/rate${rate}_$name.json" > /dev/null
  done
done
