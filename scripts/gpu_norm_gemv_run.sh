#!/usr/bin/env bash
# Issue 11, the RMSNorm folded into the qkv / gate_up GEMVs at batch 1 (TIDEGATE_FUSED_NORM_GEMV),
# on one H200 in one device call:
#
#   OUT=$OUT bash scripts/gpu_norm_gemv_run.sh        # results under $OUT (default out/gpu_norm)
#
# 1. `pytest -m gpu tests/test_norm_gemv_gpu.py` (33B shapes vs the unfused pair and the oracle,
#    a PDL chain of fused launches in a graph vs plain launches) and the PDL / GEMV / norm tests
#    of tests/test_kernels_gpu.py; TEST_S cap.
# 2. `bench/kernels/fp8_gemv_sweep.py --shapes qkv_norm,gate_up_norm` for fp8 and bf16 weights: the
#    fused kernel per tile beside the unfused pair (norm kernel + committed GEMV); each writes the
#    fastest fused tile per shape to $R/tuned_norm_{fp8,bf16}.json. Every fused program reads
#    the whole [1, 7168] x and residual in its prologue, so tiles with more rows (fewer programs,
#    less L2 traffic) are in the list beside the committed thin ones.
# 3. `bench.engine.steps` on the 33B preset (dummy weights), batch-1 decode graphs only, with
#    the fused norms on for the rows and the per-kernel profile, and `--ab --ab-fused-norm`:
#    norms separate vs fused, bucket-1 graph recaptured per variant, two interleaved rounds,
#    bf16 and fp8 (the swept fused tiles applied); BENCH_S deadline.
# SECTIONS (default tests,sweep,engine) picks which run. Everything lands in $OUT/r and is packed
# into $OUT/results.tar.gz.
set -u
OUT=${OUT:-out/gpu_norm}
TEST_S=${TEST_S:-90}
SWEEP_S=${SWEEP_S:-50}
BENCH_S=${BENCH_S:-150}
SECTIONS=${SECTIONS:-tests,sweep,engine}
R=${R:-$OUT/r}
mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
has() { case ",$SECTIONS," in *",$1,"*) return 0 ;; esac; return 1; }

{ nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem,power.draw --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} > "$R/env.txt" 2>&1
cat "$R/env.txt"

if has tests; then
  timeout -s INT "$TEST_S" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
      tests/test_norm_gemv_gpu.py tests/test_kernels_gpu.py -k "norm or pdl or fp8_gemv" \
      > "$R/pytest_gpu.txt" 2>&1
  echo "pytest exit $?"
  grep -E "passed|failed|error|FAILED|ERROR" "$R/pytest_gpu.txt" | tail -n 12
fi

if has sweep; then
  # tiles BN,BK,WARPS,R (R=1: per-tile row sums); the first of each list is the committed tile
  FP8_TILES="8,1024,2,1;16,1024,4,1;16,512,2,1;32,512,4,1;32,256,2,1;64,256,4,1"
  timeout -s INT "$SWEEP_S" python3 -m bench.kernels.fp8_gemv_sweep --out "$R" --weights fp8 \
      --shapes qkv_norm,gate_up_norm --programs 1 --budget-s $((SWEEP_S - 10)) \
      --shape-tiles "qkv_norm=$FP8_TILES" --shape-tiles "gate_up_norm=4,1024,1,1;$FP8_TILES" \
      --tuned-out "$R/tuned_norm_fp8.json" > "$R/sweep_norm_fp8_log.txt" 2>&1
  echo "fp8 norm sweep exit $?"; grep -E "copy|us |took" "$R/sweep_norm_fp8_log.txt" | tail -n 4
  BF16_TILES="8,512,2,1;16,512,2,1;16,1024,4,1;32,256,2,1;32,512,4,1"
  timeout -s INT "$SWEEP_S" python3 -m bench.kernels.fp8_gemv_sweep --out "$R" --weights bf16 \
      --shapes qkv_norm,gate_up_norm --programs 1 --budget-s $((SWEEP_S - 10)) \
      --shape-tiles "qkv_norm=$BF16_TILES" --shape-tiles "gate_up_norm=8,512,2,0;$BF16_TILES" \
      --tuned-out "$R/tuned_norm_bf16.json" > "$R/sweep_norm_bf16_log.txt" 2>&1
  echo "bf16 norm sweep exit $?"; grep -E "copy|us |took" "$R/sweep_norm_bf16_log.txt" | tail -n 4
fi
TUNED=$(ls "$R"/tuned_norm_fp8.json "$R"/tuned_norm_bf16.json 2>/dev/null | paste -sd, -)

if has engine; then
  TIDEGATE_FUSED_NORM_GEMV=1 timeout -s INT $((BENCH_S + 25)) python3 -m bench.engine.steps \
      --deadline-s "$BENCH_S" --out "$R/engine_bench.json" --decode-batches 1 --buckets 1 \
      --prefill-tokens= --profile-contexts= --no-peer --kernel-profile --ab --ab-fused-norm \
      ${TUNED:+--gemv-configs "$TUNED"} > "$R/engine_log.txt" 2>&1
  echo "engine bench exit $?"
  grep -E "kernel profile|^\[.*\]     |a/b|decode|ERROR|SKIP" "$R/engine_log.txt" | tail -n 60
fi

tar czf "$OUT/results.tar.gz" -C "$R" .
echo "packed $(du -h "$OUT/results.tar.gz" | cut -f1)"
