#!/usr/bin/env bash
# Issue 12's quantized-decode split policy and the host tier's batched copies on one H200, in one
# device call (results under $OUT, default out/gpu_kvq; log on stdout):
#
#   bash scripts/gpu_kvq_run.sh
#
# 1. `gpu_kernels_check.py --sections splits`: decode attention per KV format (bf16 / fp8 /
#    int4-fp8) at each candidate context split (the split policy's source).
# 2. `bench.engine.host_tier --copy-rate`: the tier's block copies on the 33B preset's pools,
#    batched vs one copy per layer tensor, per KV format.
# 3. `pytest -m gpu`: the tier's copies byte-exact on the GPU, and quantized decode attention at
#    more splits (33B and tiny-coder heads).
# 4. `bench.engine.host_tier` end to end on the 33B preset (if time is left).
set -u
OUT=${OUT:-out/gpu_kvq}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
t0=$(date +%s)
timeout -s INT "${SPLITS_S:-95}" python3 -m bench.kernels.gpu_check --skip-tests --sections splits \
    --budget-s $(( ${SPLITS_S:-95} - 8 )) --out "$OUT" > "$OUT/splits_log.txt" 2>&1
echo "splits exit $? at $(( $(date +%s) - t0 )) s"
grep -E "best|ceilings|Error|error" "$OUT/splits_log.txt" | tail -n 30
timeout -s INT "${COPY_S:-40}" python3 -m bench.engine.host_tier --copy-rate --model deepseek-coder-33b \
    --device cuda --copy-blocks 64 --json "$OUT/copy_rate.json" > "$OUT/copy_rate_log.txt" 2>&1
echo "copy rate exit $? at $(( $(date +%s) - t0 )) s"; tail -n 5 "$OUT/copy_rate_log.txt"
timeout -s INT "${TEST_S:-60}" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_host_kv_copies.py \
    tests/test_kernels_gpu.py -k "host_kv or gpu_tier or quantized_decode_at_more_splits or quantized_dot_dtypes" \
    > "$OUT/pytest_gpu.txt" 2>&1
echo "pytest exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/pytest_gpu.txt" | tail -n 12
if [ -n "${BENCH_S:-}" ]; then
  timeout -s INT "$BENCH_S" python3 -m bench.engine.host_tier --model deepseek-coder-33b --device cuda \
      --num-blocks 1100 --host-kv-gib 16 --num-groups 14 --prefix-len 4096 --num-requests 40 --rate 2 \
      --max-num-batched-tokens 4096 --json "$OUT/host_tier_33b.json" > "$OUT/host_tier_33b_log.txt" 2>&1
  echo "host tier bench exit $? at $(( $(date +%s) - t0 )) s"; grep -E "copy_gb|TTFT|^\|" "$OUT/host_tier_33b_log.txt" | tail -n 8
fi
