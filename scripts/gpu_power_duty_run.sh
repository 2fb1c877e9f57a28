#!/usr/bin/env bash
# Issue 35, session 41 (prediction 38): the power limiter's answer to bursts of mixed steps at the live shapes,
# on one card, per model (`bench/engine/power_duty.py`). On the device machine, from the repo root:
#   OUT=/path MODELS="deepseek-coder-6.7b deepseek-coder-6.7b:fp8 deepseek-coder-33b" bash scripts/gpu_power_duty_run.sh
# ~25 s a model to load (the 33B ~60 s, FP8 quantizing ~+20 s) + 9 patterns x (1 + 3 s) + the paused steps.
# Writes $OUT/duty_<model>[_fp8].json and $OUT/duty_log.txt. MODEL:fp8 = --quantization fp8.
set -uo pipefail
OUT=${OUT:?set OUT}
MODELS=${MODELS:-deepseek-coder-6.7b deepseek-coder-6.7b:fp8 deepseek-coder-33b}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.limit,temperature.gpu --format=csv,noheader | tee -a "$OUT/duty_log.txt"
for m in $MODELS; do
  model=${m%%:*}; extra=(); tag=$model
  if [ "$m" != "$model" ]; then extra=(--quantization "${m#*:}"); tag=${model}_${m#*:}; fi
  echo "== $tag $(date -u +%H:%M:%S)" | tee -a "$OUT/duty_log.txt"
  python3 -m bench.engine.power_duty --model "$model" --load-format dummy --device cuda "${extra[@]}" \
      --out "$OUT/duty_${tag}.json" 2>&1 | tee -a "$OUT/duty_log.txt"
done
