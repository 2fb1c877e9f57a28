#!/usr/bin/env bash
# Issue 7 on one H200, in one device call: the engine's GPU tests, then the engine benchmark.
#
#   bash scripts/gpu_engine_run.sh                 # writes under $OUT (default out/gpu_engine)
#   TEST_S=75 BENCH_S=280 bash scripts/gpu_engine_run.sh --layers 16   # extra args -> bench.engine.steps
#
# 1. `pytest -m gpu` on tests/test_gpu_engine_*.py (graphs vs eager, kernel path vs torch path,
#    no allocation per graph step, fp8 quality and graphs) then tests/test_kernels_gpu.py, under a
#    TEST_S cap (SIGINT: pytest still prints what ran). Output: $OUT/pytest_gpu.txt.
# 2. `python3 -m bench.engine.steps` with a BENCH_S deadline (sections that would not fit are skipped
#    and listed); the JSON is rewritten after every row: $OUT/engine_bench.json, the simulator's
#    profile $OUT/profile_h200.json, the log $OUT/bench_log.txt. The table prints last.
# Needs only torch, triton, transformers, tokenizers, safetensors, pytest (no pyzmq).
set -u
OUT=${OUT:-out/gpu_engine}
TEST_S=${TEST_S:-75}
BENCH_S=${BENCH_S:-280}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."

{ nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if python3 -c 'import pytest' 2>/dev/null; then
  timeout -s INT "$TEST_S" python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider \
      tests/test_gpu_engine_graphs.py tests/test_gpu_engine_quantization.py tests/test_kernels_gpu.py \
      > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest exit $?"
  grep -E "passed|failed|error|FAILED|ERROR" "$OUT/pytest_gpu.txt" | tail -n 15
else
  echo "pytest not installed: gpu tests skipped" | tee "$OUT/pytest_gpu.txt"
fi

timeout -s INT $((BENCH_S + 25)) python3 -m bench.engine.steps --deadline-s "$BENCH_S" \
    --out "$OUT/engine_bench.json" --profile-out "$OUT/profile_h200.json" "$@" \
    > "$OUT/bench_log.txt" 2>&1
echo "bench exit $?"
grep -v "^\[" "$OUT/bench_log.txt" | tail -n 80
