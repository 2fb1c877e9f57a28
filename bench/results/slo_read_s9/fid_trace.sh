#!/usr/bin/env bash
# Issue 31, ninth session: slo_lag_s8/fid_trace.sh (the seventh session's fidelity runs, 600 ms
# windows, TTFT targets + 600 ms, the lag trace on) with EXTRA_WINDOW appended to the window flags
# of both gateways, the planner and the replay (e.g. EXTRA_WINDOW=--compete-window). RUNS="w10a
# w15a ..." (w05: 0.5x, w10: 1.0x, w15: 1.5x); TREE: a copy of the tree under test.
# TRACE=0: without the trace.
HERE=$(cd "$(dirname "$0")" && pwd)
TREE=${TREE:-/tmp/b31s9_cw}
for run in ${RUNS:-w10a w15a}; do
  case $run in w05*) RATE=15.9;; w10*) RATE=31.9;; w15*) RATE=47.8;; esac
  OUTD=${OUTROOT:-/tmp/b31s9cw}/fid_$run
  rm -rf "$OUTD"; mkdir -p "$OUTD"
  echo "start $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" > "$OUTD/load.txt"
  if [ "${TRACE:-1}" = 1 ]; then
    export TIDEGATE_LAG_TRACE=$OUTD/trace PYTHONPATH=$HERE/../slo_lag_s8/trace
  else
    unset TIDEGATE_LAG_TRACE PYTHONPATH
  fi
  OUT=$OUTD PY=/work/main/.venv/bin/python RATE=$RATE MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 \
    DEVICE=cpu N=600 INPUT=32 OUTPUT=uniform:1:80 SLO=fast=750,normal=1000,slow=1600 \
    WINDOW="--target-throughput 1 --min-latency-ms 600 --no-idle-flush ${EXTRA_WINDOW:-}" \
    bash "$TREE/scripts/gpu_slo_run.sh" > "$OUTD/run.txt" 2>&1
  echo "end $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> "$OUTD/load.txt"
done
