#!/usr/bin/env bash
# Issue 28 on the H200: speculative decoding's checks and benchmarks, one device call per PART
# (each fits the 10-minute limit). Results under $OUT.
#
#   PART=check  1. the GPU tests (tests/test_gpu_speculation.py): verify chunks in real mixed-step
#                  CUDA graphs and eagerly, token-identical to decoding without speculation in
#                  float32 (greedy and seeded sampling, bf16 pages and int4-fp8 with fill rows),
#                  bf16 agreement printed            -> $OUT/pytest_gpu_spec.txt
#               2. tiny-coder on held-out code (stdlib files where the held-out packages are not
#                  installed), c = 1: acceptance per source and TPOT with prompt lookup and oracle
#                  predictions vs off, outputs checked identical (bench.engine.speculation)
#                                                    -> $OUT/tiny_coder_spec.json, .txt
#               3. the same on the 33B preset (dummy bf16 weights) at c = 1, engine level: the
#                  mechanism's TPOT with oracle predictions (100/75/50% of lines) vs off
#                                                    -> $OUT/33b_engine_spec.json, .txt
#   PART=serve  scripts/gpu_spec_bench.sh PART=serve (tidegate serve, 33B dummy): oracle edit
#               c=1 100/75/50% and c=8 100% vs off; saturation 512/128x400 and 16/32x256 with
#               the server's policy vs per-request off; traces for the simulator
#   PART=sim    scripts/gpu_spec_bench.sh PART=sim (profile, simulator vs live)
#
#   PART=check bash scripts/gpu_spec_run.sh ; PART=serve bash scripts/gpu_spec_run.sh ; PART=sim ...
#   (each part < 10 minutes: check = tests <= TEST_S 180 s + tiny-coder <= 120 s + 33B <= 270 s)
#   DEVICE=cpu MODEL33=tiny PROMPTS=2 MAXTOK=24 bash scripts/gpu_spec_run.sh     # the CPU check
set -u
OUT=${OUT:-out/gpu_spec}
PART=${PART:-check}
DEVICE=${DEVICE:-cuda}
MODEL33=${MODEL33:-deepseek-coder-33b}
PROMPTS=${PROMPTS:-8}
MAXTOK=${MAXTOK:-128}
TEST_S=${TEST_S:-180}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
PY=${PY:-python3}
[ -x .venv/bin/python ] && [ "$DEVICE" = cpu ] && PY=.venv/bin/python

if [ "$PART" = serve ] || [ "$PART" = sim ]; then
  OUT="$OUT" DEVICE="$DEVICE" PART="$PART" exec bash scripts/gpu_spec_bench.sh
fi
[ "$PART" = check ] || { echo "PART must be check, serve or sim" >&2; exit 2; }

{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
  git log -1 --format='%H %s' 2>/dev/null
  $PY -c 'import torch; print("torch", torch.__version__)'; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
rc=0
if [ "$DEVICE" != cpu ] && $PY -c 'import pytest' 2>/dev/null; then
  timeout -s INT "$TEST_S" $PY -m pytest -m gpu -q -rfEs -s -p no:cacheprovider \
      tests/test_gpu_speculation.py > "$OUT/pytest_gpu_spec.txt" 2>&1 || rc=1
  grep -E "passed|failed|error|FAILED|ERROR|bf16" "$OUT/pytest_gpu_spec.txt" | tail -n 12
fi
timeout 120 $PY -m bench.engine.speculation --model models/tiny-coder --device "$DEVICE" \
    --prompts "$PROMPTS" --max-tokens "$MAXTOK" --json "$OUT/tiny_coder_spec.json" \
    > "$OUT/tiny_coder_spec.txt" 2>&1 || rc=1
tail -n 9 "$OUT/tiny_coder_spec.txt"
timeout 270 $PY -m bench.engine.speculation --model "$MODEL33" --load-format "${LOAD_FORMAT:-dummy-cycle}" \
    --device "$DEVICE" --prompts "$((PROMPTS / 2 > 0 ? PROMPTS / 2 : 1))" --max-tokens "$MAXTOK" \
    --modes off,oracle-100,oracle-75,oracle-50 --json "$OUT/33b_engine_spec.json" \
    > "$OUT/33b_engine_spec.txt" 2>&1 || rc=1
tail -n 6 "$OUT/33b_engine_spec.txt"
exit $rc
