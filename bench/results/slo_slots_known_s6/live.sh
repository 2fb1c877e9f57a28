#!/usr/bin/env bash
# Issue 31, sixth session: the live runs, alternated (RUNS="old1 new1 ..."), each the fifth
# session's command. Trees: `git archive` of 3e2ad7c (old) into /tmp/b31_before, d42e740
# (new1-4) into /tmp/b31_after, cfdd3b7 (new5-8, mid*) into /tmp/b31_final, 953bc5cd (fin*) into
# /tmp/b31_f2, same venv; from run 3 every tree given the newest bench/serving/slo_control.py
# and (from run 7) scripts/gpu_slo_run.sh (per-class and warm-up counts; --records).
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
