#!/usr/bin/env bash
# Issue 31, seventeenth session (H31D): the issue's live benchmark (s14-s16's command exactly:
# scripts/gpu_slo_run.sh, RATE=47.8 echo 4 x 8 x 20 ms, seed 2, a probe every 3rd refusal, the
# eighth session's lag trace) in two forms, alternated: d* the default; e* with DEADLINE_ORDER=1
# (the gateways send each request's TTFT deadline, --send-deadlines; the echo backends give the
# last free slot to the earliest-deadline request when it cannot wait one more slot and the
# class order's next one can, --deadline-order; the planner and the replay run the same).
# The tree: a `git archive` of the commit under test in $TREE. RUNS="d01 e01 d02 e02 ...".
TREE=${TREE:-/tmp/h31d/tree}
OUTROOT=${OUTROOT:-/tmp/h31d/s17}
for run in ${RUNS:-d01 e01}; do
  OUTD=$OUTROOT/live_$run
  rm -rf "$OUTD"; mkdir -p "$OUTD/trace"
  echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUTD/load.txt"
  export TIDEGATE_LAG_TRACE=$OUTD/trace PYTHONPATH=$TREE/bench/results/slo_lag_s8/trace
  unset DEADLINE_ORDER
  case $run in
    e*) export DEADLINE_ORDER=1;;
  esac
  OUT=$OUTD PY=/work/main/.venv/bin/python RATE=47.8 MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 DEVICE=cpu \
    N=600 INPUT=32 OUTPUT=uniform:1:80 SLO=fast=150,normal=400,slow=1000 \
    bash "$TREE/scripts/gpu_slo_run.sh" > "$OUTD/run.txt" 2>&1
  echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) deadline_order=${DEADLINE_ORDER:-0}" >> "$OUTD/load.txt"
done
