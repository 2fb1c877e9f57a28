#!/usr/bin/env bash
# Issue 31, sixteenth session (H31M): the issue's live benchmark (s14/s15's command exactly:
# scripts/gpu_slo_run.sh, RATE=47.8 echo 4 x 8 x 20 ms, seed 2, a probe every 3rd refusal) in
# forms, alternated: d* the default admission; n* with NORMAL_OVERTAKE_Q=$Q (a Normal request
# admitted only if its slot wait at that quantile of the later Fast arrivals meets its deadline:
# --normal-overtake-quantile); m* with NORMAL_OVERTAKE_Q=$Q2; f* with FLEET_RATE=1 (the higher
# classes' arrivals projected at the fleet's mean rate per backend: --fleet-arrival-rate); g*
# with both FLEET_RATE=1 and NORMAL_OVERTAKE_Q=$Q. Every run with the eighth session's lag trace
# (bench/results/slo_lag_s8/trace) for the miss attribution (miss_trace.py, echo_cf.py).
# The tree: a `git archive` of the commit under test in $TREE. RUNS="d01 n01 d02 n02 ...".
TREE=${TREE:-/tmp/h31m/tree}
OUTROOT=${OUTROOT:-/tmp/h31m/s16}
Q=${Q:-0.95}
Q2=${Q2:-0.9}
for run in ${RUNS:-d01 n01}; do
  OUTD=$OUTROOT/live_$run
  rm -rf "$OUTD"; mkdir -p "$OUTD/trace"
  echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUTD/load.txt"
  export TIDEGATE_LAG_TRACE=$OUTD/trace PYTHONPATH=$TREE/bench/results/slo_lag_s8/trace
  unset NORMAL_OVERTAKE_Q FLEET_RATE
  case $run in
    n*) export NORMAL_OVERTAKE_Q=$Q;;
    m*) export NORMAL_OVERTAKE_Q=$Q2;;
    f*) export FLEET_RATE=1;;
    g*) export FLEET_RATE=1 NORMAL_OVERTAKE_Q=$Q;;
  esac
  OUT=$OUTD PY=/work/main/.venv/bin/python RATE=47.8 MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 DEVICE=cpu \
    N=600 INPUT=32 OUTPUT=uniform:1:80 SLO=fast=150,normal=400,slow=1000 \
    bash "$TREE/scripts/gpu_slo_run.sh" > "$OUTD/run.txt" 2>&1
  echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) form q=${NORMAL_OVERTAKE_Q:-none} fleet=${FLEET_RATE:-0}" >> "$OUTD/load.txt"
done
