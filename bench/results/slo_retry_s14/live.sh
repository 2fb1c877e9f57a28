#!/usr/bin/env bash
# Issue 31, fourteenth session: the live Retry-After check, alternated (RUNS="old1 new1 ..."),
# the seventh session's command. Trees: `git archive` of 5f1bf0d (old: the Retry-After the
# point estimate) into /tmp/h31/oldtree; the same with this session's scheduler/admission.py
# and sims/retry_after_bound.py (new: the median over the admission futures, the gateway's
# queue ahead) into /tmp/h31/newtree; same venv. Outputs in /tmp/h31/s14/live_RUN.
for run in ${RUNS:-old1 new1 old2 new2}; do
  case $run in old*) TREE=/tmp/h31/oldtree;; new*) TREE=/tmp/h31/newtree;; medonly*) TREE=/tmp/h31/treeB;; gwonly*) TREE=/tmp/h31/treeC;; esac
  OUTD=/tmp/h31/s14/live_$run
  rm -rf $OUTD; mkdir -p $OUTD
  echo "start $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" > $OUTD/load.txt
  OUT=$OUTD PY=/work/main/.venv/bin/python RATE=47.8 MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 DEVICE=cpu \
    N=600 INPUT=32 OUTPUT=uniform:1:80 SLO=fast=150,normal=400,slow=1000 \
    bash $TREE/scripts/gpu_slo_run.sh > $OUTD/run.txt 2>&1
  echo "end $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUTD/load.txt
done
