#!/usr/bin/env bash
# Issue 31 on one GPU machine, in one device call: the SLO control at 1.5x capacity with the 33B
# preset (dummy bf16 weights), and the planner's prediction made before it.
#
#   bash scripts/gpu_slo_run.sh                                   # writes under $OUT (out/gpu_slo)
#   MODEL=models/tiny-coder DEVICE=cpu N=120 INPUT=32 OUTPUT=uniform:1:80 \
#       SLO=fast=2000,normal=6000,slow=15000 bash scripts/gpu_slo_run.sh   # the CPU check
#   MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 DEVICE=cpu N=600 INPUT=32 \
#       OUTPUT=uniform:1:80 SLO=fast=150,normal=400,slow=1000 bash scripts/gpu_slo_run.sh
#       # the issue's live goal on 4 CPU backends: echo backends with a constant 20 ms step
#       # (RATE=47.8: that rate instead of $LOAD x the burst's capacity, for runs compared at one)
#       # and 8 sequences at most (a queue as our engine's, class-ordered), which the
#       # simulator's constant step models (decision fidelity below uses --step-ms)
#
# The device call's 600 s: start-up (33B dummy, <= 120 s), capacity <= 150 s, plan <= 90 s,
# control <= 300 s.
# 1. $BACKENDS backends; two gateways on them: A with --slo-ttft-ms $SLO (admission, decision
#    log), B without; both with --placement $PLACEMENT
# 2. capacity: a burst of $N requests through B (rate inf) -> requests/s C
# 3. the planner's prediction for rate 1.5 C (`tidegate sim slo`, the H200 roofline of $MODEL; on
#    the CPU the check skips it unless PROFILE is given), written before the live run
# 4. bench.serving.slo_control at 1.5 C: A then B on the same schedule (Retry-After vs the wait
#    of a probe, every $PROBE_EVERY-th refusal re-sent admitted, and vs the control run's wait;
#    deadline misses, Fast TTFT p90, attainment per class)
# 5. decision fidelity of A's log: the simulator's admission and windows on the same arrivals
set -u
OUT=${OUT:-out/gpu_slo}
MODEL=${MODEL:-deepseek-coder-33b}
DEVICE=${DEVICE:-cuda}
N=${N:-400}
INPUT=${INPUT:-512}
OUTPUT=${OUTPUT:-uniform:2:128}
SLO=${SLO:-fast=600,normal=3000,slow=10000}
LOAD=${LOAD:-1.5}
PROFILE=${PROFILE:-}
BACKENDS=${BACKENDS:-1}
# echo: by predicted TTFT (admission predicts on the backend placement then picks; BENCHMARKS,
# issue 31, third session); otherwise the gateway's default (issue 31, second session: ttft
# placement with the gap model refused twice as much)
PLACEMENT=${PLACEMENT:-$([ "$MODEL" = echo ] && echo ttft || echo prefix)}
SEED=${SEED:-2}                    # the control run's schedule; the planner simulates the same arrivals
PROBE_EVERY=${PROBE_EVERY:-3}     # every 3rd refusal re-sent admitted: the wait it would have had
ECHO_STEP_MS=${ECHO_STEP_MS:-}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-}
# the batching window's flags for both gateways, the planner and the replay (issue 31's fidelity
# goal wants windows of >= 8), e.g. WINDOW="--max-batch-size 8 --min-latency-ms 400
# --target-throughput 1 --no-idle-flush"; empty: the defaults
read -r -a WINFLAGS <<< "${WINDOW:-}"
source "$(dirname "$0")/gpu_common.sh"  # pyzmq/aiohttp missing on the machine: carry .whl

LOADFMT=(--load-format dummy)
{ [ -d "$MODEL" ] || [ "$MODEL" = echo ]; } && LOADFMT=()
BEFLAGS=()
[ -n "$ECHO_STEP_MS" ] && BEFLAGS+=(--echo-step-ms "$ECHO_STEP_MS")
[ -n "$MAX_NUM_SEQS" ] && BEFLAGS+=(--max-num-seqs "$MAX_NUM_SEQS")
[ "$DEVICE" = cpu ] && [ "$BACKENDS" -gt 1 ] && BEFLAGS+=(--cpu-threads 1)
BACKS=()
for k in $(seq 1 "$BACKENDS"); do
  SOCK=ipc:///tmp/tg-slo-$$-$k.sock
  $TG backend --listen "$SOCK" --model "$MODEL" "${LOADFMT[@]}" --device "$DEVICE" "${BEFLAGS[@]}" \
      > "$OUT/backend_$k.log" 2>&1 &
  pids+=($!)
  BACKS+=(--backend "$SOCK")
done
GWFLAGS=("${BACKS[@]}" --placement "$PLACEMENT" --startup-timeout 600 "${WINFLAGS[@]}")
# echo backends: slot-bound, Fast first: admission's slot model describes them (both gateways:
# placement by predicted TTFT reads the same predictor)
[ "$MODEL" = echo ] && GWFLAGS+=(--slot-model)
$TG serve "${GWFLAGS[@]}" --port 18501 --slo-ttft-ms "$SLO" --decision-log "$OUT/decisions_a.jsonl" \
    > "$OUT/gateway_a.log" 2>&1 &
pids+=($!)
$TG serve "${GWFLAGS[@]}" --port 18502 > "$OUT/gateway_b.log" 2>&1 &
pids+=($!)
for port in 18501 18502; do
  for _ in $(seq 1 600); do
    curl -sf "localhost:$port/health" >/dev/null && break
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a process exited (logs in $OUT)"; exit 1; }; done
    sleep 1
  done
done
curl -sf localhost:18501/health >/dev/null || { echo "gateway A not healthy"; exit 1; }

# 2. capacity through the control gateway (warm-up burst first)
$TG bench serve --url http://127.0.0.1:18502 --num-requests 32 --rate inf --input-len "$INPUT" \
    --output-len "$OUTPUT" --seed 9 > /dev/null 2>&1
timeout 150 $TG bench serve --url http://127.0.0.1:18502 --num-requests "$N" --rate inf --input-len "$INPUT" \
    --output-len "$OUTPUT" --seed 1 --json "$OUT/capacity.json" > "$OUT/capacity.txt" 2>&1
CAP=$($PY -c "import json; print(json.load(open('$OUT/capacity.json'))['request_throughput'])")
if [ -n "${RATE:-}" ]; then  # given: runs compared at one rate (a burst's capacity on a shared CPU varies)
  echo "capacity $CAP req/s; rate $RATE given" | tee "$OUT/rate.txt"
else
  RATE=$($PY -c "print(round($LOAD * $CAP, 3))")
  echo "capacity $CAP req/s -> rate $RATE" | tee "$OUT/rate.txt"
fi

# 3. the planner's prediction, before the live run
COST=()
if [ -n "$ECHO_STEP_MS" ]; then COST=(--step-ms "$ECHO_STEP_MS")
elif [ -n "$PROFILE" ]; then COST=(--profile "$PROFILE")
elif [ "$DEVICE" != cpu ]; then COST=(--model "$MODEL" --gpu h200); fi
# the same seed as the control run's schedule: the same arrivals (at 1.5x the Slow class's
# attainment depends on them: 19-78% over seeds 0-2 in the simulator, same rate)
SIMFLAGS=(--placement "$PLACEMENT" --seed "$SEED" "${WINFLAGS[@]}")
[ -n "$MAX_NUM_SEQS" ] && SIMFLAGS+=(--max-num-seqs "$MAX_NUM_SEQS")
# echo backends admit their waiting requests Fast first (our engine: FCFS); the simulator too
[ "$MODEL" = echo ] && SIMFLAGS+=(--waiting-by-class --slot-model)
if [ ${#COST[@]} -gt 0 ]; then
  timeout 90 $TG sim slo "${COST[@]}" "${SIMFLAGS[@]}" --backends "$BACKENDS" \
      --max-backends $((BACKENDS + 1)) --rate "$RATE" --num-requests "$N" \
      --input-len "$INPUT" --output-len "$OUTPUT" --slo-ttft-ms "$SLO" --attainment 0.99 \
      --json "$OUT/plan.json" > "$OUT/plan.txt" 2>&1
  cat "$OUT/plan.txt"
fi

# 4. the control check at LOAD x capacity. CONTROL_FIRST=1 runs the control (no admission) first:
# on 2026-12-04 the first run (admission) served 97 ms per output token and the second (control)
# 22 ms at the same rate, so which run goes first has to be told apart from admission itself
timeout 300 $PY -m bench.serving.slo_control --url http://127.0.0.1:18501 --control-url http://127.0.0.1:18502 \
    ${CONTROL_FIRST:+--control-first} --slo-ttft-ms "$SLO" --rate "$RATE" --num-requests "$N" --input-len "$INPUT" \
    --output-len "$OUTPUT" --seed "$SEED" --probe-every "$PROBE_EVERY" --json "$OUT/slo_control.json" \
    --records "$OUT/records_a.jsonl" 2>&1 | tee "$OUT/slo_control.txt"
curl -s localhost:18501/metrics | grep -E "^tidegate_(slo|admission|window|refused)" > "$OUT/metrics_a.txt"

# 5. decision fidelity of A's windows and admission decisions
FFLAGS=(--backends "$BACKENDS" --placement "$PLACEMENT" "${WINFLAGS[@]}")
[ -n "$MAX_NUM_SEQS" ] && FFLAGS+=(--max-num-seqs "$MAX_NUM_SEQS")
[ "$MODEL" = echo ] && FFLAGS+=(--waiting-by-class --slot-model)
$PY -m bench.simulator.decision_fidelity "$OUT/decisions_a.jsonl" --slo-ttft-ms "$SLO" "${COST[@]}" \
    "${FFLAGS[@]}" > "$OUT/decision_fidelity.json" 2>&1
cat "$OUT/decision_fidelity.json"
