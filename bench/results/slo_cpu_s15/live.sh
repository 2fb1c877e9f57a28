#!/usr/bin/env bash
# Issue 31, fifteenth session: repeats of the live Retry-After benchmark on ONE schedule
# (seed 2: the seventh and fourteenth sessions' runs), to measure how much the same refused
# request's probe wait moves between repeats. The fourteenth session's command exactly
# (scripts/gpu_slo_run.sh, RATE=47.8 echo 4 x 8 x 20 ms, a probe every 3rd refusal), the tree a
# `git archive` of the commit under test in $TREE, the repository's venv. RUNS="q01 t01 q02 ...":
# t* with the eighth session's lag trace on (bench/results/slo_lag_s8/trace: every Batch's
# backend, every step's started requests), q* without. Outputs in $OUTROOT/live_RUN.
TREE=${TREE:-/tmp/h31b/tree}
OUTROOT=${OUTROOT:-/tmp/h31b/s15}
for run in ${RUNS:-q01 t01}; do
  OUTD=$OUTROOT/live_$run
  rm -rf "$OUTD"; mkdir -p "$OUTD"
  echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" > "$OUTD/load.txt"
  case $run in
    t*) mkdir -p "$OUTD/trace"
        export TIDEGATE_LAG_TRACE=$OUTD/trace PYTHONPATH=/work/main/bench/results/slo_lag_s8/trace;;
    *) unset TIDEGATE_LAG_TRACE PYTHONPATH;;
  esac
  OUT=$OUTD PY=/work/main/.venv/bin/python RATE=47.8 MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 DEVICE=cpu \
    N=600 INPUT=32 OUTPUT=uniform:1:80 SLO=fast=150,normal=400,slow=1000 \
    bash "$TREE/scripts/gpu_slo_run.sh" > "$OUTD/run.txt" 2>&1
  echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> "$OUTD/load.txt"
done
