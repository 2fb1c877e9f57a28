#!/usr/bin/env bash
# Issue 11's serving benchmark on one GPU machine, in one device call: `tidegate serve` with the
# 33B preset (dummy bf16 weights, embedded backend on cuda), issue 11's four workloads through
# `tidegate bench serve`, then the same with --quantization fp8; the backend's step log from the
# same run beside each (bench/serving/suite.py says what is computed from it).
#
#   bash scripts/gpu_serving_run.sh                         # writes under $OUT (default out/gpu_serving)
#   bash scripts/gpu_serving_run.sh --max-num-batched-tokens 1024   # extra args -> tidegate serve
#   MODEL=tiny DEVICE=cpu WORKLOADS=tiny CONFIGS="a=" bash scripts/gpu_serving_run.sh   # CPU check
#
# Environment: MODEL (deepseek-coder-33b), DEVICE (cuda), WORKLOADS (issue11 | tiny), CONFIGS
# (space-separated NAME=FLAGS; % stands for a space inside FLAGS; NAME=FLAGS@w1,w2 runs only those
# workloads; default: bf16 weights and KV, then the A/B of the prefill cap while decoding
# (issue 11's ITL p99 at 8 req/s: a CUDA backend caps at 256 tokens by default since session 5,
# `--max-prefill-tokens-while-decoding 0` turns it off; the workloads it can change), then the 512/128 workloads with each quantized KV format (issue 12), then fp8
# weights), SUITE_S (hard cap in seconds, default 540), DEADLINE_S (start nothing new after,
# default SUITE_S - 120), WORK (working folder, default $OUT/serving). pyzmq/protobuf missing
# on the machine: carry .whl (wheels) and they are installed first. Outputs:
# $OUT/serving_table.md, $OUT/summary.json and everything else packed in
# $OUT/serving_results.tar.gz (the device tool returns at most 8 files).
set -u
OUT=${OUT:-out/gpu_serving}
MODEL=${MODEL:-deepseek-coder-33b}
DEVICE=${DEVICE:-cuda}
WORKLOADS=${WORKLOADS:-issue11}
CONFIGS=${CONFIGS:-"bf16= nocap=--max-prefill-tokens-while-decoding%0@long_8rps,long_burst,short_burst kvfp8=--kv-cache-dtype%fp8@long_8rps,long_burst kvint4=--kv-cache-dtype%int4-fp8@long_8rps,long_burst fp8=--quantization%fp8"}
SUITE_S=${SUITE_S:-540}
DEADLINE_S=${DEADLINE_S:-$((SUITE_S - 120))}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
PY=${PY:-python3}
[ -x .venv/bin/python ] && [ "$DEVICE" = cpu ] && PY=.venv/bin/python

if ! $PY -c 'import zmq' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

WORK=${WORK:-$OUT/serving}  # on the device machine: outside $OUT (only 8 files come back)
mkdir -p "$OUT"
mkdir -p "$WORK"
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
  $PY -c 'import triton; print("triton", triton.__version__)' 2>/dev/null
} > "$WORK/env.txt" 2>&1
cat "$WORK/env.txt"

if [ "$DEVICE" != cpu ]; then  # the two ceilings, measured in this run (prefill's fraction of them)
  timeout 60 $PY - > "$WORK/ceilings.json" <<'PYEOF'
import json, torch, triton.testing as tt
n = 1 << 30
src = torch.empty(n // 2, dtype=torch.bfloat16, device="cuda").normal_(); dst = torch.empty_like(src)
copy_ms = tt.do_bench(lambda: dst.copy_(src), warmup=10, rep=200, return_mode="median")
src = dst = None
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); b = torch.randn_like(a)
mm_ms = tt.do_bench(lambda: a @ b, warmup=10, rep=200, return_mode="median")
print(json.dumps({"copy_tb_s": 2 * n / copy_ms / 1e9, "bf16_matmul_tflop_s": 2 * 8192**3 / mm_ms / 1e9}))
PYEOF
  cat "$WORK/ceilings.json"
fi

# SM clock, power and temperature every 20 ms for the whole suite, on the step log's wall clock
# (a step that runs slower on the device at the same shape: clocks or not). The throttle reasons
# in a second sampler: a field this driver does not know must not cost the first one.
smi_pids=()
if [ "$DEVICE" != cpu ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv,noheader,nounits -lms 20 > "$WORK/gpu_clocks.csv" 2>&1 &
  smi_pids+=($!)
  nvidia-smi --query-gpu=timestamp,clocks_event_reasons.active \
    --format=csv,noheader -lms 100 > "$WORK/gpu_clock_reasons.csv" 2>&1 &
  smi_pids+=($!)
fi

config_args=()
for c in $CONFIGS; do config_args+=(--config "${c//%/ }"); done

timeout -s INT "$SUITE_S" $PY -m bench.serving.suite --out "$WORK" --workloads "$WORKLOADS" \
    --deadline-s "$DEADLINE_S" "${config_args[@]}" \
    -- --model "$MODEL" --load-format dummy --device "$DEVICE" "$@"
rc=$?
echo "serving suite exit $rc"
for pid in "${smi_pids[@]}"; do kill "$pid" 2>/dev/null; done
cp "$WORK/serving_table.md" "$WORK/summary.json" "$OUT/" 2>/dev/null
tar czf "$OUT/serving_results.tar.gz" -C "$(dirname "$WORK")" "$(basename "$WORK")"
exit $rc
