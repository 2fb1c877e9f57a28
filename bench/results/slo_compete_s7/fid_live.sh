#!/usr/bin/env bash
# Issue 31, seventh session: simulator vs live with windows of >= 8 requests (the fidelity goal):
# the workload at 0.5x / 1.0x / 1.5x (15.9 / 31.9 / 47.8 req/s) with a 600 ms window
# (--target-throughput 1 --min-latency-ms 600 --no-idle-flush: every window held for 600 ms,
# ~1 + 0.6 x rate requests) and the TTFT targets raised by the window's 600 ms
# (fast=750,normal=1000,slow=1600). Tree: `git archive` of 020a59e into /tmp/b31s7_head.
# RUNS="w05a w10a w15a ..." (w05: 0.5x, w10: 1.0x, w15: 1.5x).
for run in ${RUNS:-w05a w10a w15a}; do
  case $run in w05*) RATE=15.9;; w10*) RATE=31.9;; w15*) RATE=47.8;; esac
  OUTD=/tmp/b31s7/fid_$run
  rm -rf $OUTD; mkdir -p $OUTD
  echo "start $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" > $OUTD/load.txt
  OUT=$OUTD PY=/work/main/.venv/bin/python RATE=$RATE MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 \
    DEVICE=cpu N=600 INPUT=32 OUTPUT=uniform:1:80 SLO=fast=750,normal=1000,slow=1600 \
    WINDOW="--target-throughput 1 --min-latency-ms 600 --no-idle-flush" \
    bash /tmp/b31s7_head/scripts/gpu_slo_run.sh > $OUTD/run.txt 2>&1
  echo "end $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUTD/load.txt
done
