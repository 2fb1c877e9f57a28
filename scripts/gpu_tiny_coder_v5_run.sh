#!/usr/bin/env bash
# Issue 36, tiny-coder v5: v4's one-call run (scripts/gpu_tiny_coder_v4_run.sh: the corpus built
# ON the H200 from its own Python, then scripts/gpu_tiny_coder_run.sh's training, int8 export and
# evaluations), with the corpus re-weighted toward code like the held-out packages and more of
# the call spent on training. One device call of at most 560 s.
#
# Why: v4 met every goal but FIM (7/32 exact, goal >= 8/32; similarity 0.582, goal >= 0.6). In
# 23 of its 25 held-out misses the model itself rates the removed line below what it wrote
# (median 9.8 nats), so no decoding reaches the goal; the model has to know the code better.
# v4's training text was 69% scientific / ML code (179.5 of 259.4 MB: transformers,
# statsmodels, pandas, scikit-learn, scipy, numba, jax, sympy, matplotlib, numpy, ... 4-12 MB
# each), while the held-out (aiohttp, hypothesis, Jinja2, click) and validation (fsspec, anyio,
# pyparsing, httpx2, h11) packages are web, CLI, testing and parsing code; and its validation
# loss was still falling at the last step (2.6 passes, 366M tokens in 310 s). v5 changes:
#
#   1. Corpus shares. Each source of training.device_corpus.SCIENTIFIC is capped at 3 MB
#      (`--group-max-bytes 3e6`; v4: 12 MB for every source): the group goes from 179.5 to
#      ~101.7 MB (18 of its 78 sources are over 3 MB). The development machine's standard-library test suite travels in the carry as
#      the source python-stdlib-tests (985 files, 18.9 MB of text; the image's stdlib has no
#      test suite; v3's corpus had it): testing code of asyncio, http, email, argparse,
#      unittest, ... `--max-source-bytes 24e6` so that it is not cut at 12 MB (every other
#      source that is not in the group is under 9 MB). Expected training text ~200 MB
#      (science 51%, general 40%, stdlib tests 9.4%), a ~109M-token stream.
#   2. Time. RESERVE_S 80 (v4: 110; v4's export + evaluations used ~50 s of it, the GPU pytest
#      check is skipped when < 30 s are left), the validation / held-out gzip and xz sizes
#      computed in threads in `train prepare` (v4: ~14 s serial), and the smaller corpus
#      (prepare's tokenizing scales with it: v4 36 s for 259 MB). Training budget ~380 s
#      against v4's 327 s; MAX_EPOCHS 5 (v4: 4) so that the time budget, not the pass cap, ends
#      it (~440M tokens = ~4 passes; v3 was best at ~5.9 passes, and the trainer ships the
#      best validation checkpoint anyway).
#   3. Unchanged: tokenizer, shape (8x512x1408), schedule, FIM rates (v4's FIM documents
#      closed 31 of 32 held-out middles with <eos>: the format is learned; the misses are
#      content), decoding defaults (frequency_penalty 0.8), contamination rules and check.
#
# Evidence for 1 (bench/results/tiny_coder_v5_prep/): a tiny CPU training of v4's shares
# against v5's on equal bytes of the development corpus, scored on the validation packages.
#
# Before the call, here (CPU; ~40 s; .carry-tc-v5 is git-excluded):
#
#   .venv/bin/python -m training.device_corpus carry --from .carry-tc-6mb/corpus \
#       --device-packages training/device_packages.txt --out .carry-tc-v5 --stdlib-tests
#   # (2026-12-04 19:29: 72 sources, 62.4 MB of text, 7.55 MB of xz: v4's 5.02 MB + the
#   # stdlib tests)
#   bash scripts/device_slim.sh out    # the lead's: the tree must leave room for the carry
#   (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb | tail -1
#   du -cb .carry-tc-v5 | tail -1      # tree + carry < 67.1 MB
#
# The call (device tool `run`, kind nvidia-h200, carry [".carry-tc-v5"], timeout_s 600):
#
#   CARRY=.carry-tc-v5 bash scripts/gpu_tiny_coder_v5_run.sh
#
# Under $OUT (7 files at most), as v4: log.txt, metrics.json, tiny-coder.tar.part-aa/-ab,
# eval.json, eval_defaults.json, serve_check.json (only with pyzmq there). Shipping:
# scripts/gpu_tiny_coder_run.sh's header; v5 replaces models/tiny-coder only if held-out
# bits/byte stays <= 0.80 and the headers stay >= 7/8 at the defaults.
#
# CPU dry run of the whole script (tiny settings; this machine's own .venv stands in for the
# image's packages: its held-out and validation distributions are excluded as they would be
# there; 2026-12-04 19:40 UTC on the 2-core box: 36 s, rc 0, corpus / prepare / train / both
# evals exit 0, the model back in one part; PATH puts the .venv's python3 first, as the image's
# is):
#
#   PATH=$PWD/.venv/bin:$PATH \
#   OUT=/tmp/v5dry/out TMPDIR=/tmp/v5dry COMPILE= TOTAL_S=100000 RESERVE_S=0 EVAL_THREADS=1 \
#   CORPUS_ARGS="--max-files 400 --workers 2 --group-max-bytes 3e6 --max-source-bytes 24e6" \
#   PREPARE_ARGS="--max-files 60 --workers 2" \
#   TRAIN_ARGS="--device cpu --steps 3 --batch-size 2 --seq-len 64 --warmup-steps 1 \
#     --eval-every 2 --eval-windows 4 --eval-batch-size 4 --sample-tokens 8 --layers 1 \
#     --hidden-size 32 --intermediate-size 64 --heads 2 --kv-heads 1" \
#   EVAL_ARGS="--files-sample 1 --fim-cases 2 --heldout-headers 1" \
#   CARRY=.carry-tc-v5 bash scripts/gpu_tiny_coder_v5_run.sh
#
# Knobs: TOTAL_S (550: the whole command, corpus included), CORPUS_S (90), WORKERS (nproc),
# MAX_EPOCHS (5), RESERVE_S (80), CORPUS_ARGS (default "--group-max-bytes 3e6
# --max-source-bytes 24e6"; "" for v4's corpus rule), and everything
# scripts/gpu_tiny_coder_run.sh takes (SHAPE, TRAIN_S, PREPARE_ARGS, TRAIN_ARGS, EVAL_ARGS,
# EVAL_THREADS, COMPILE=).
set -u
OUT=${OUT:-out/gpu_tiny_coder_v5}
CARRY=${CARRY:-.carry-tc-v5}
TOTAL_S=${TOTAL_S:-550}
CORPUS_ARGS=${CORPUS_ARGS-"--group-max-bytes 3e6 --max-source-bytes 24e6"}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
SCRATCH=${TMPDIR:-/tmp}
t0=$(date +%s)
since() { echo $(( $(date +%s) - t0 )); }
{
  echo "== tiny-coder v5: the corpus from this machine's Python (training.device_corpus)," \
       "scientific sources capped, stdlib tests carried"
  python3 -c 'import os, sys, sysconfig; print("python", sys.version.split()[0], sys.executable,
"cpus", os.cpu_count(), "stdlib", sysconfig.get_paths()["stdlib"])'
  echo "installed distributions (pip list):"
  python3 -m pip list --format=freeze 2>/dev/null | tr '\n' ' '
  echo
  echo "corpus args: ${CORPUS_ARGS}"
} 2>&1 | tee "$LOG"
rm -rf "$SCRATCH/tc-v5"
python3 -m training.device_corpus build --carry "$CARRY" --out "$SCRATCH/tc-v5/corpus" \
    --workers "${WORKERS:-$(nproc)}" --time-budget-s "${CORPUS_S:-90}" ${CORPUS_ARGS} \
    2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "corpus exit $rc at $(since) s" | tee -a "$LOG"
if [ "$rc" -ne 0 ]; then
  echo "no training: the corpus build failed (exit 3: the contamination check)" | tee -a "$LOG"
  exit "$rc"
fi
du -sb "$SCRATCH/tc-v5/corpus/corpus.jsonl" | tee -a "$LOG"
left=$(( TOTAL_S - $(since) ))
echo "== training, export and evaluations: ${left} s left" | tee -a "$LOG"
CARRY="$SCRATCH/tc-v5" OUT="$OUT" TOTAL_S="$left" RESERVE_S="${RESERVE_S:-80}" \
    TRAIN_ARGS="--max-epochs ${MAX_EPOCHS:-5} ${TRAIN_ARGS:-}" \
    bash scripts/gpu_tiny_coder_run.sh
echo "v5 done at $(since) s" | tee -a "$LOG"
