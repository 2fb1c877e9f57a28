#!/usr/bin/env bash
# tidegate next to vLLM's CPU build on one or more checkpoints, measured by vLLM's own client
# (issue 32): each server alone on the machine, the order alternating between rounds, 200
# requests of 128/32 tokens at rate inf and at 20 req/s, greedy, --ignore-eos.
#
#   scripts/cpu_vs_vllm.sh [MODEL ...]      default: models/tiny-coder llama-2x256 llama-3x384
#
# A MODEL is a checkpoint directory, or a shape name that bench/serving/compare_vllm.py makes
# under OUT (llama-2x256, llama-3x384, gqa-rope: random bf16 weights, byte-level tokenizer).
# Needs vLLM's CPU build from ../shared/peers/vllm-cpu/setup.sh (PEERS=... to point elsewhere).
# Environment (defaults in brackets):
#   OUT [bench/results/cpu_vs_vllm_$(date +%Y%m%d)]  runs.json, table.md, vLLM's result JSONs, logs
#   ROUNDS [2]  RATES ["inf 20"]  NUM_PROMPTS [200]  IN_LEN [128]  OUT_LEN [32]
#   TIDEGATE_ARGS []  extra `tidegate serve` flags (e.g. "--dtype float32" for the old default)
#   QUIET_FILE []     a file created while each server runs and removed after (this repo's shared
#                     dev machine uses /work/QUIET to pause other work)
#   QUIET_WAIT [20]   seconds between creating QUIET_FILE and starting the server
# Prints the table; the CPU (model name and bf16 flags) is in every row and under the table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PEERS=${PEERS:-../shared/peers/vllm-cpu}
OUT=${OUT:-bench/results/cpu_vs_vllm_$(date -u +%Y%m%d)}
MODELS=("$@")
[[ ${#MODELS[@]} -gt 0 ]] || MODELS=(models/tiny-coder llama-2x256 llama-3x384)
[[ -x "${PEERS_DIR:-$HOME/.cache/tidegate-peers}/vllm-venv/bin/vllm-cpu" ]] \
    || { echo "no vLLM CPU build: run $PEERS/setup.sh first" >&2; exit 1; }
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) | flags: $(grep -o 'avx512_bf16\|amx_bf16\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
ARGS=(--models "$(IFS=,; echo "${MODELS[*]}")" --rounds "${ROUNDS:-2}" --rates ${RATES:-inf 20}
      --num-prompts "${NUM_PROMPTS:-200}" --in-len "${IN_LEN:-128}" --out-len "${OUT_LEN:-32}"
      --peers "$PEERS" --out "$OUT")
[[ -n "${TIDEGATE_ARGS:-}" ]] && ARGS+=(--tidegate-args "$TIDEGATE_ARGS")
[[ -n "${QUIET_FILE:-}" ]] && ARGS+=(--quiet-file "$QUIET_FILE" --quiet-wait "${QUIET_WAIT:-20}")
exec "$PY" -m bench.serving.compare_vllm "${ARGS[@]}"
