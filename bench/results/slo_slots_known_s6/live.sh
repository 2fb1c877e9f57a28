#!/usr/bin/env bash
# old1 new1 old2 new2, as the fifth session
for run in ${RUNS:-old1 new1 old2 new2}; do
  case $run in old*) TREE=/tmp/b31_before;; new[1-4]) TREE=/tmp/b31_after;; new*|mid*) TREE=/tmp/b31_final;; fin*) TREE=/tmp/b31_f2;; esac
  OUTD=/tmp/b31/live_$run
  rm -rf $OUTD; mkdir -p $OUTD
  echo "start $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" > $OUTD/load.txt
  OUT=$OUTD PY=/work/main/.venv/bin/python RATE=47.8 MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 DEVICE=cpu \
    N=600 INPUT=32 OUTPUT=uniform:1:80 SLO=fast=150,normal=400,slow=1000 \
    bash $TREE/scripts/gpu_slo_run.sh > $OUTD/run.txt 2>&1
  echo "end $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUTD/load.txt
done
