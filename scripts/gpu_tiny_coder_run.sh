#!/usr/bin/env bash
# Issue 17: retrain tiny-coder in one H200 device call: tokenize, choose the shape by validation
# loss (`python -m training.train sweep`), train the winner, evaluate it on the held-out packages and
# export it. NOT YET RUN: written in a session without device time.
#
# Before the call, on the development machine (CPU; the corpus and tokenizer are made here so the
# call spends its time on the GPU):
#
#   .venv/bin/python -m training.corpus --out /tmp/tc-corpus   # [--max-source-bytes 8e6]
#   .venv/bin/python -m training.train prepare --corpus /tmp/tc-corpus --out /tmp/tc-tok \
#       --tokenizer-only
#   rm -rf .carry-tc && mkdir -p .carry-tc/corpus
#   xz -T2 -6 -c /tmp/tc-corpus/corpus.jsonl > .carry-tc/corpus/corpus.jsonl.xz   # 8 MB cap: 19.7 MB
#   cp /tmp/tc-corpus/manifest.json .carry-tc/corpus/ && cp /tmp/tc-tok/tokenizer.json .carry-tc/
#   git -C . archive HEAD scripts | tar x -C .carry-tc                          # this script + trainer
#
# The call (device tool `run`, carry [".carry-tc"], limit 600 s):
#
#   cd .carry-tc && bash scripts/gpu_tiny_coder_run.sh
#
# Under $OUT: train_log.txt (stdout), metrics.json, tiny-coder.tar.part-aa, -ab (the model
# directory, split because a returned file is at most 16 MiB). Afterwards, here:
#
#   cat OUT/tiny-coder.tar.part-* | tar x -C /tmp && cp /tmp/tiny-coder/* models/tiny-coder/
#   tidegate eval code --model models/tiny-coder --dtype float32 --files-sample 8 --fim-cases 32 \
#       --cpu-threads 2 --json models/tiny-coder/eval.json      # the engine's figures, on the CPU
#   .venv/bin/python -m training.train card --model models/tiny-coder
#
# The engine's evaluation runs on the development CPU, not here: it reads the held-out packages
# from the .venv's site-packages (their versions are the corpus's), which the GPU machine lacks.
# CPU dry run of this script's plumbing (tiny corpus in .carry-tc, 16 s here):
#   OUT=/tmp/dry/out TMPDIR=/tmp/dry COMPILE= SWEEP_ARGS="--device cpu --candidates 1x32x64/2/1 \
#     2x32x64/2/1 --candidate-steps 4 --steps 6 --seq-len 32 --batch-size 2 --warmup-steps 2 \
#     --eval-every 4" bash scripts/gpu_tiny_coder_run.sh
set -u
OUT=${OUT:-out/gpu_tiny_coder}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
t0=$(date +%s)
python3 -c 'import torch, tokenizers, transformers; print("torch", torch.__version__, "tokenizers",
tokenizers.__version__, "transformers", transformers.__version__,
torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'
python3 -m training.train prepare --corpus corpus --out "${TMPDIR:-/tmp}/tc-prep" \
    --tokenizer tokenizer.json 2>&1 | tee "$OUT/train_log.txt"
echo "prepare exit ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s"
# 420 s of sweep + training leave ~100 s of the 600-s call for prepare (above), the held-out
# evaluation, the transformers check and export; BUDGET_S shortens it if prepare ran long.
left=$(( 540 - ($(date +%s) - t0) - 60 ))
budget=${BUDGET_S:-$(( left < 420 ? left : 420 ))}
echo "sweep budget ${budget} s"
# SWEEP_ARGS (appended, so they override) and COMPILE= are for a CPU dry run of this script
python3 -m training.train sweep --prep "${TMPDIR:-/tmp}/tc-prep" --out "${TMPDIR:-/tmp}/tiny-coder" ${COMPILE---compile} \
    --time-budget-s "$budget" --sweep-frac 0.3 \
    --seq-len 1024 --batch-size 64 --lr 2e-3 --min-lr 1e-4 --warmup-steps 200 --dropout 0.05 \
    --eval-every 250 ${SWEEP_ARGS:-} 2>&1 | tee -a "$OUT/train_log.txt"
echo "sweep exit ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s"
cp "${TMPDIR:-/tmp}/tiny-coder/metrics.json" "$OUT/" 2>/dev/null
tar c -C "${TMPDIR:-/tmp}" tiny-coder | split -b 15m - "$OUT/tiny-coder.tar.part-"
ls -l "$OUT"
echo "done at $(( $(date +%s) - t0 )) s"
