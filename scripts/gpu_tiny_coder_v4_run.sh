#!/usr/bin/env bash
# Issue 36, tiny-coder v4: the corpus built ON the H200 from its own Python, then v3's training,
# int8 export and evaluations (scripts/gpu_tiny_coder_run.sh, called with what is left of the
# time), in ONE device call of at most 560 s.
#
# Why: v3 over-fitted (7.1 passes over a 70.1M-token stream of 132.8 MB; validation loss best at
# step 6,250 of 7,550; held-out 0.860 bits/byte against v2's 0.824) because the corpus had to
# travel, capped at 6 MB per source, and the tree (50.7 MB) now leaves < 15 MB for a carry. The
# H200 image has its own Python 3.12 stdlib and ~200 distributions (torch, transformers, jax,
# pandas, scikit-learn, statsmodels, sympy, scipy, numba, ...: /work/.library/device/KINDS.md,
# training/device_packages.txt), so `training.device_corpus build` reads them there (16
# processes, bounded by CORPUS_S), under training.corpus's rules, plus a small carry: the
# held-out and validation files (the development machine's versions) and the training files of
# the distributions the image lacks (openai, anthropic, ray, kubernetes, pydantic, ...).
# Contamination: training/device_corpus.py's docstring (whole held-out/validation distributions
# never read on the machine, whatever their version; their import names dropped anywhere; exact
# and near duplicates of the carried held-out/validation text dropped; a final check that fails
# the build). The schedule: the time budget, but at most MAX_EPOCHS (4) passes over the stream;
# the trainer ships the checkpoint of the best validation loss.
#
# Before the call, here (CPU; ~2 min; .carry-tc-v4 is git-excluded):
#
#   .venv/bin/python -m training.device_corpus carry --from .carry-tc-6mb/corpus \
#       --device-packages training/device_packages.txt --out .carry-tc-v4
#   # what travels must stay under 64 MiB (67.1 MB): tracked + untracked-not-ignored + the carry
#   (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb | tail -1
#   du -cb .carry-tc-v4 | tail -1
#   # (2026-12-04 16:18: carry 5.02 MB -- 198 held-out + 156 validation files and 6,059 training
#   # files of 62 distributions the image lacks, 43.4 MB of text, xz -9 in 25 s; tree 51.9 MB;
#   # together 56.9 MB of 67.1)
#
# The call (device tool `run`, kind nvidia-h200, carry [".carry-tc-v4"], timeout_s 600):
#
#   CARRY=.carry-tc-v4 bash scripts/gpu_tiny_coder_v4_run.sh
#
# Under $OUT (7 files at most): log.txt (everything printed: the machine's Python, site
# directories, every source with its version, licence and role, the build's timing and
# contamination counts), metrics.json, tiny-coder.tar.part-aa/-ab (the int8 model directory, its
# corpus_manifest.json included), eval.json, eval_defaults.json, serve_check.json (only with
# pyzmq there). Shipping: scripts/gpu_tiny_coder_run.sh's header (the same steps).
#
# Run 2026-12-04 18:18-18:27 (505 s): 259.4 MB of training text, 366M tokens in 310.5 s, held-out
# 0.7888 bits/byte (int8 0.7889). Shipped as models/tiny-coder v4; raw outputs in
# bench/results/tiny_coder_v4_h200/.
#
# CPU dry run of the whole script (tiny settings; this machine's own .venv stands in for the
# image's packages: its held-out and validation distributions are excluded as they would be
# there; 29 s on the 2-core box on 2026-12-04, every step exit 0, the model back in one part):
#
#   OUT=/tmp/v4dry/out TMPDIR=/tmp/v4dry COMPILE= TOTAL_S=100000 RESERVE_S=0 EVAL_THREADS=1 \
#   CORPUS_ARGS="--max-files 400 --workers 2" PREPARE_ARGS="--max-files 60 --workers 2" \
#   TRAIN_ARGS="--device cpu --steps 3 --batch-size 2 --seq-len 64 --warmup-steps 1 \
#     --eval-every 2 --eval-windows 4 --eval-batch-size 4 --sample-tokens 8 --layers 1 \
#     --hidden-size 32 --intermediate-size 64 --heads 2 --kv-heads 1" \
#   EVAL_ARGS="--files-sample 1 --fim-cases 2 --heldout-headers 1" \
#   CARRY=.carry-tc-v4 bash scripts/gpu_tiny_coder_v4_run.sh
#
# Knobs: TOTAL_S (550: the whole command, corpus included), CORPUS_S (90: reading and hashing
# stop there), WORKERS (nproc), MAX_EPOCHS (4), CORPUS_ARGS (e.g. --max-source-bytes 12e6
# --max-train-bytes 320e6, the defaults), and everything scripts/gpu_tiny_coder_run.sh takes
# (SHAPE, TRAIN_S, RESERVE_S, PREPARE_ARGS, TRAIN_ARGS, EVAL_ARGS, EVAL_THREADS, COMPILE=).
set -u
OUT=${OUT:-out/gpu_tiny_coder_v4}
CARRY=${CARRY:-.carry-tc-v4}
TOTAL_S=${TOTAL_S:-550}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
SCRATCH=${TMPDIR:-/tmp}
t0=$(date +%s)
since() { echo $(( $(date +%s) - t0 )); }
{
  echo "== tiny-coder v4: the corpus from this machine's Python (training.device_corpus)"
  python3 -c 'import os, sys, sysconfig; print("python", sys.version.split()[0], sys.executable,
"cpus", os.cpu_count(), "stdlib", sysconfig.get_paths()["stdlib"])'
  echo "installed distributions (pip list):"
  python3 -m pip list --format=freeze 2>/dev/null | tr '\n' ' '
  echo
} 2>&1 | tee "$LOG"
rm -rf "$SCRATCH/tc-v4"
python3 -m training.device_corpus build --carry "$CARRY" --out "$SCRATCH/tc-v4/corpus" \
    --workers "${WORKERS:-$(nproc)}" --time-budget-s "${CORPUS_S:-90}" ${CORPUS_ARGS:-} \
    2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "corpus exit $rc at $(since) s" | tee -a "$LOG"
if [ "$rc" -ne 0 ]; then
  echo "no training: the corpus build failed (exit 3: the contamination check)" | tee -a "$LOG"
  exit "$rc"
fi
du -sb "$SCRATCH/tc-v4/corpus/corpus.jsonl" | tee -a "$LOG"
left=$(( TOTAL_S - $(since) ))
echo "== training, export and evaluations: ${left} s left" | tee -a "$LOG"
CARRY="$SCRATCH/tc-v4" OUT="$OUT" TOTAL_S="$left" \
    TRAIN_ARGS="--max-epochs ${MAX_EPOCHS:-4} ${TRAIN_ARGS:-}" \
    bash scripts/gpu_tiny_coder_run.sh
echo "v4 done at $(since) s" | tee -a "$LOG"
