#!/usr/bin/env bash
# Issue 31, seventh session: the live runs, alternated (RUNS="old1 new1 ..."), each the sixth
# session's command. Trees: `git archive` of 43eda9a (old: before this session) into
# /tmp/b31s7_old; the same with this session's scheduler/admission.py (new: a free slot contested
# by the higher classes' arrivals before the backend's next step) into /tmp/b31s7_new; same venv.
for run in ${RUNS:-old1 new1 old2 new2}; do
  case $run in old*) TREE=/tmp/b31s7_old;; new*) TREE=/tmp/b31s7_new;; esac
  OUTD=/tmp/b31s7/live_$run
  rm -rf $OUTD; mkdir -p $OUTD
  echo "start $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" > $OUTD/load.txt
  OUT=$OUTD PY=/work/main/.venv/bin/python RATE=47.8 MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 DEVICE=cpu \
    N=600 INPUT=32 OUTPUT=uniform:1:80 SLO=fast=150,normal=400,slow=1000 \
    bash $TREE/scripts/gpu_slo_run.sh > $OUTD/run.txt 2>&1
  echo "end $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUTD/load.txt
done
