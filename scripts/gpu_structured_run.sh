#!/usr/bin/env bash
# Issue 29 on one H200, in one device call: structured output's GPU tests, then the step time of a
# batch with and without JSON-schema rows on the 33B preset (dummy weights behind a 32k BPE
# vocabulary trained here on the stdlib, so masks cost what a real vocabulary's do).
#
#   bash scripts/gpu_structured_run.sh            # writes under $OUT (default out/gpu_structured)
#   DEVICE=cpu MODEL_DIR=models/tiny-coder BATCH=8 STEPS=16 bash scripts/gpu_structured_run.sh  # CPU check
#
# llguidance / jsonschema missing on the machine: carry .whl (the wheels in /.whl/, gitignored:
# llguidance 1.9.1 abi3, jsonschema and its deps for cp310-312) and they are installed first.
# Outputs ($OUT): env.txt, pytest_structured.txt (the gpu-marked tests of
# tests/test_structured_backend.py: the bitmask on CUDA = CPU, graph steps with grammar rows
# pipelined and valid; tests/test_structured_close.py: grammars closed to fit max_tokens on
# CUDA graph steps, pipelined = synchronous), steps.json (bench.structured.steps, greedy and temperature 0.7 on one engine load: batch
# 64, half with a schema, ms per step = TPOT, ratio to the free batch, eager steps, pipelined
# grammar steps), engines.txt (bench.structured.engines on the 32k vocabulary), log.txt.
set -u
OUT=${OUT:-out/gpu_structured}
DEVICE=${DEVICE:-cuda}
BATCH=${BATCH:-64}
STEPS=${STEPS:-96}
REPEATS=${REPEATS:-2}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
PY=${PY:-python3}
[ -x .venv/bin/python ] && [ "$DEVICE" = cpu ] && PY=.venv/bin/python
mkdir -p "$OUT"
if ! $PY -c 'import llguidance, jsonschema' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/llguidance-*.whl .whl/jsonschema*.whl .whl/referencing-*.whl .whl/attrs-*.whl \
      .whl/typing_extensions-*.whl \
      $(ls .whl/rpds_py-*-cp$($PY -c 'import sys; print("%d%d" % sys.version_info[:2])')-*.whl) \
      || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
  $PY -c 'import sys, torch, llguidance; print("python", sys.version.split()[0], "torch", torch.__version__, "llguidance", llguidance.__version__)'
  grep -o 'avx512_bf16\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; nproc
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

MARK=(-m gpu); [ "$DEVICE" = cpu ] && MARK=(-m "not gpu")
timeout -s INT 240 $PY -m pytest "${MARK[@]}" -q -rfEs -p no:cacheprovider tests/test_structured_backend.py \
    tests/test_structured_close.py \
    > "$OUT/pytest_structured.txt" 2>&1
echo "pytest exit $?"; grep -E "passed|failed|error" "$OUT/pytest_structured.txt" | tail -n 5

MODEL_DIR=${MODEL_DIR:-/tmp/ds33b-bpe}
LOAD=dummy; [ -f "$MODEL_DIR/model.safetensors" ] && LOAD=auto
if [ ! -f "$MODEL_DIR/config.json" ]; then
  timeout 300 $PY -m bench.structured.vocab "$MODEL_DIR" --preset deepseek-coder-33b --max-mb 24 \
      >> "$OUT/log.txt" 2>&1 || { echo "vocab build failed"; tail -5 "$OUT/log.txt"; }
fi
timeout -s INT 480 $PY -m bench.structured.steps --model "$MODEL_DIR" --load-format $LOAD \
    --device "$DEVICE" --batch "$BATCH" --fraction 0.5 --steps "$STEPS" --repeats "$REPEATS" \
    --temperature 0,0.7 --json "$OUT/steps.json" >> "$OUT/log.txt" 2>&1
echo "steps exit $?"; grep -E "ms/step|cost per step" "$OUT/log.txt" | tail -n 6
timeout 240 $PY -m bench.structured.engines --tokenizer "$MODEL_DIR/tokenizer.json" --eos 2 \
    > "$OUT/engines.txt" 2>&1
cat "$OUT/engines.txt"
