#!/usr/bin/env bash
# Issue 31 on one GPU machine, in one device call: the SLO control at 1.5x capacity with the 33B
# preset (dummy bf16 weights), and the planner's prediction made before it.
#
#   bash scripts/gpu_slo_run.sh                                   # writes under $OUT (out/gpu_slo)
#   MODEL=models/tiny-coder DEVICE=cpu N=120 N_SWEEP=30 INPUT=32 OUTPUT=uniform:1:80 \
#       SLO=fast=2000,normal=6000,slow=15000 bash scripts/gpu_slo_run.sh   # the CPU check
#   MODEL=echo ECHO_STEP_MS=20 MAX_NUM_SEQS=8 BACKENDS=4 DEVICE=cpu N=600 INPUT=32 \
#       OUTPUT=uniform:1:80 SLO=fast=150,normal=400,slow=1000 bash scripts/gpu_slo_run.sh
#       # the issue's live goal on 4 CPU backends: echo backends with a constant 20 ms step
#       # (RATE=47.8: that rate instead of $LOAD x the burst's capacity, for runs compared at one)
#       # and 8 sequences at most (a queue as our engine's, class-ordered), which the
#       # simulator's constant step models (decision fidelity below uses --step-ms)
#
# The device call's 600 s: start-up (33B dummy, <= 120 s), capacity sweep <= 150 s, plan <= 90 s,
# control <= 200 s (the 2026-12-04 call, with a burst for capacity: 106 s in all).
# 1. $BACKENDS backends (our engine: --waiting-by-class, Fast first, as admission assumes;
#    WAITING_BY_CLASS=0: FCFS); two gateways on them: A with --slo-ttft-ms $SLO (admission,
#    decision log), B without; both with --placement $PLACEMENT
# 2. capacity: the rate where TTFT starts to grow (bench.serving.rate_knee), from a short sweep
#    through B: a burst of 64 for the scale C0, then $N_SWEEP requests at each of $SWEEP x C0
#    (fresh prompts each), up to the first rate whose TTFT p90 passes 2x the lowest's + 50 ms
#    -> C. Not a rate-inf burst of $N: that measures the throughput with a full queue
# 3. the planner's prediction for rate 1.5 C (`tidegate sim slo`: $PROFILE, by default the 33B
#    H200 profile of the fidelity grid, else the H200 roofline of $MODEL; on the CPU the check
#    skips it unless PROFILE is given), written before the live run
# 4. bench.serving.slo_control at 1.5 C: A then B on the same schedule (CONTROL_FIRST=1: B
#    first), B's prompts of other content (the second run would hit the first's prefix cache),
#    the client's connections uncapped (Retry-After vs the wait of a probe, every
#    $PROBE_EVERY-th refusal re-sent admitted, and vs the control run's wait; deadline misses,
#    Fast TTFT p90, attainment per class)
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
# the measured H200 profile of the 33B (issue 35's grid) for the planner; another model: the roofline
PROFILE33=bench/results/fidelity_grid_h200_s13/33b-seeds/profile_33b-seeds.json
PROFILE=${PROFILE-$([ "$MODEL" = deepseek-coder-33b ] && [ "$DEVICE" != cpu ] && echo "$PROFILE33")}
[ -z "$PROFILE" ] || [ -f "$PROFILE" ] || { echo "profile $PROFILE missing (scripts/device_slim.sh out keeps profile*.json)"; exit 1; }
# every profiled step time x this for the planner and the replay. auto (the default with a profile):
# measured in this call, before the plan: the simulator runs the capacity step's 64-request burst
# (same seed, lengths, engine flags) on the profile, and the scale is its throughput over the burst's
# live one (the profile is another call's, and the H200's level under sustained prefill moves by a
# few % between calls, issue 35: on 2026-12-04 the 400-request burst ran 16.35 req/s simulated
# against 14.55 live, x1.124). 1: as measured; a number: that scale (given RATE: no burst, so 1)
PROFILE_SCALE=${PROFILE_SCALE:-auto}
BACKENDS=${BACKENDS:-1}
N_SWEEP=${N_SWEEP:-120}               # requests per rate of the capacity sweep
SWEEP=${SWEEP:-0.5,0.75,1.0,1.15,1.3,1.45,1.6,1.8,2}  # its rates, x the 64-request burst's throughput
WAITING_BY_CLASS=${WAITING_BY_CLASS:-1}  # our engine admits Fast first (echo: always)
# OVERTAKE=1 (with WAITING_BY_CLASS=1, not echo): admission's gap model projects the Fast and
# Normal arrivals that pass a waiting Slow request (--overtake; OVERTAKE_HORIZON_S: over that
# long at most) in gateway A, the planner and the replay (issue 31, s15, H31C:
# bench/results/slo_gap_class_s15). Default 0: as before
OVERTAKE=${OVERTAKE:-0}
OVERTAKE_HORIZON_S=${OVERTAKE_HORIZON_S:-}
OVFLAGS=()
if [ "$OVERTAKE" = 1 ] && [ "$MODEL" != echo ] && [ "$WAITING_BY_CLASS" = 1 ]; then
  OVFLAGS=(--overtake)
  [ -n "$OVERTAKE_HORIZON_S" ] && OVFLAGS+=(--overtake-horizon-s "$OVERTAKE_HORIZON_S")
fi
# NORMAL_OVERTAKE_Q=Q (with the slot model: echo): a Normal request admitted only if its slot
# wait at the Q-quantile of the Fast arrivals after it meets its deadline (--normal-overtake-
# quantile; issue 31, s16, H31M: bench/results/slo_misses_s16). Default empty: as before
NORMAL_OVERTAKE_Q=${NORMAL_OVERTAKE_Q:-}
[ -n "$NORMAL_OVERTAKE_Q" ] && OVFLAGS+=(--normal-overtake-quantile "$NORMAL_OVERTAKE_Q")
# FLEET_RATE=1 (the slot model): the higher classes' arrivals projected at the fleet's mean rate
# per backend (--fleet-arrival-rate; the same session's bench/results/slo_misses_s16)
[ "${FLEET_RATE:-0}" = 1 ] && OVFLAGS+=(--fleet-arrival-rate)
# DEADLINE_ORDER=1: the gateways send each request's TTFT deadline (--send-deadlines) and the
# backends start a waiting request that would miss it waiting for the next free slot before the
# class order's next one where that one can wait (--deadline-order, DEADLINE_MARGIN_MS: extra
# room; the planner and the replay: the same flags; issue 31, s17, H31D:
# bench/results/slo_deadline_s17). Default 0: as before
DLFLAGS=()
if [ "${DEADLINE_ORDER:-0}" = 1 ]; then
  DLFLAGS=(--deadline-order)
  [ -n "${DEADLINE_MARGIN_MS:-}" ] && DLFLAGS+=(--deadline-margin-ms "$DEADLINE_MARGIN_MS")
fi
PORT_A=${PORT_A:-18501}  # the gateways' ports (two runs on one machine: other ports for one)
PORT_B=${PORT_B:-18502}
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
[ "$MODEL" != echo ] && [ "$WAITING_BY_CLASS" = 1 ] && BEFLAGS+=(--waiting-by-class)
BEFLAGS+=("${DLFLAGS[@]}")
for port in $PORT_A $PORT_B; do  # another run's gateway there would answer for ours
  curl -s -o /dev/null "localhost:$port/health" && { echo "port $port in use: set PORT_A / PORT_B"; exit 1; }
done
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
GWFLAGS+=("${OVFLAGS[@]}")
[ ${#DLFLAGS[@]} -gt 0 ] && GWFLAGS+=(--send-deadlines)
$TG serve "${GWFLAGS[@]}" --port $PORT_A --slo-ttft-ms "$SLO" --decision-log "$OUT/decisions_a.jsonl" \
    > "$OUT/gateway_a.log" 2>&1 &
pids+=($!)
$TG serve "${GWFLAGS[@]}" --port $PORT_B > "$OUT/gateway_b.log" 2>&1 &
pids+=($!)
for port in $PORT_A $PORT_B; do
  for _ in $(seq 1 600); do
    curl -sf "localhost:$port/health" >/dev/null && break
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a process exited (logs in $OUT)"; exit 1; }; done
    sleep 1
  done
done
curl -sf localhost:$PORT_A/health >/dev/null || { echo "gateway A not healthy"; exit 1; }

# 2. capacity through the control gateway (warm-up burst first): the rate where TTFT starts to
# grow, from a short sweep (every run's prompts of other content: seeds 1, 11, 12, ...)
$TG bench serve --url http://127.0.0.1:$PORT_B --num-requests 32 --rate inf --input-len "$INPUT" \
    --output-len "$OUTPUT" --seed 9 > /dev/null 2>&1
# the 64-request burst: the sweep's scale, and the planner's step scale (PROFILE_SCALE=auto: the
# burst simulated on the profile over its live throughput) -- also when RATE is given (the
# 2026-12-05 call's knee, 10.8 req/s, put 1.5x at 1.12x of the throughput the control run kept up
# with, where the planner predicts 100% for every class: RATE=21.75 is the overload regime)
if [ -z "${RATE:-}" ] || { [ -n "$PROFILE" ] && [ "$PROFILE_SCALE" = auto ]; }; then
timeout 60 $TG bench serve --url http://127.0.0.1:$PORT_B --num-requests 64 --rate inf --input-len "$INPUT" \
    --output-len "$OUTPUT" --seed 1 --json "$OUT/capacity_burst.json" > "$OUT/capacity.txt" 2>&1
C0=$($PY -c "import json; print(json.load(open('$OUT/capacity_burst.json'))['request_throughput'])")
echo "burst of 64: $C0 req/s (the sweep's scale)" | tee -a "$OUT/capacity.txt"
if [ -n "$PROFILE" ] && [ "$PROFILE_SCALE" = auto ]; then  # the profile's level in this call (above)
  BURSTSIM=(--placement "$PLACEMENT")
  [ "$MODEL" != echo ] && [ "$WAITING_BY_CLASS" = 1 ] && BURSTSIM+=(--waiting-by-class)
  [ "$DEVICE" != cpu ] && BURSTSIM+=(--max-prefill-tokens-while-decoding 256)
  timeout 60 $TG sim run --profile "$PROFILE" "${BURSTSIM[@]}" --rate inf --num-requests 64 \
      --input-len "$INPUT" --output-len "$OUTPUT" --seed 1 --json "$OUT/capacity_burst_sim.json" \
      > "$OUT/capacity_burst_sim.txt" 2>&1 \
    && PROFILE_SCALE=$($PY -c "import json; s = json.load(open('$OUT/capacity_burst_sim.json'))['request_throughput']
print(round(s / $C0, 4))") \
    && echo "the burst simulated on the profile: x$PROFILE_SCALE its live throughput (the planner's step scale)" \
      | tee -a "$OUT/capacity.txt"
fi
fi
if [ -n "${RATE:-}" ]; then  # given: runs compared at one rate (no capacity sweep)
  echo "rate $RATE given" | tee "$OUT/rate.txt"
else
SWEPT=()
k=0
for f in ${SWEEP//,/ }; do
  k=$((k + 1))
  r=$($PY -c "print(round($f * $C0, 3))")
  timeout 90 $TG bench serve --url http://127.0.0.1:$PORT_B --num-requests "$N_SWEEP" --rate "$r" \
      --input-len "$INPUT" --output-len "$OUTPUT" --seed $((10 + k)) --json "$OUT/sweep_$k.json" \
      > "$OUT/sweep_$k.txt" 2>&1 || break
  SWEPT+=("$OUT/sweep_$k.json")
  $PY -c "import json; d=json.load(open('$OUT/sweep_$k.json')); print('rate $r: TTFT p50 %.0f p90 %.0f ms, %.2f req/s' % (d['ttft_ms']['p50'], d['ttft_ms']['p90'], d['request_throughput']))" \
      | tee -a "$OUT/capacity.txt"
  $PY -m bench.serving.rate_knee --next "${SWEPT[@]}" || break
done
CAP=0
[ ${#SWEPT[@]} -gt 0 ] && CAP=$($PY -m bench.serving.rate_knee "${SWEPT[@]}")
# the lowest rate already past the knee (or no sweep run): the burst's scale at half
[ "$CAP" = 0.0 ] || [ "$CAP" = 0 ] && CAP=$($PY -c "print(round(0.5 * $C0, 3))")
RATE=$($PY -c "print(round($LOAD * $CAP, 3))")
echo "capacity $CAP req/s (TTFT growth knee) -> rate $RATE" | tee "$OUT/rate.txt"
fi

# 3. the planner's prediction, before the live run
[ "$PROFILE_SCALE" = auto ] && PROFILE_SCALE=1  # no burst measured (RATE given) or no profile
if [ -n "$PROFILE" ] && [ "$PROFILE_SCALE" != 1 ]; then
  $PY -c "import json, sys; p = json.load(open('$PROFILE'))
for q in p['points']:
    for k in [k for k in q if k.startswith('step_ms')]: q[k] *= $PROFILE_SCALE
json.dump(p, open('$OUT/profile_scaled.json', 'w'))" || exit 1
  echo "planner profile: $PROFILE, step times x $PROFILE_SCALE" | tee -a "$OUT/rate.txt"
  PROFILE=$OUT/profile_scaled.json
fi
COST=()
if [ -n "$ECHO_STEP_MS" ]; then COST=(--step-ms "$ECHO_STEP_MS")
elif [ -n "$PROFILE" ]; then COST=(--profile "$PROFILE")
elif [ "$DEVICE" != cpu ]; then COST=(--model "$MODEL" --gpu h200); fi
# the same seed as the control run's schedule: the same arrivals (at 1.5x the Slow class's
# attainment depends on them: 19-78% over seeds 0-2 in the simulator, same rate)
SIMFLAGS=(--placement "$PLACEMENT" --seed "$SEED" "${WINFLAGS[@]}")
[ -n "$MAX_NUM_SEQS" ] && SIMFLAGS+=(--max-num-seqs "$MAX_NUM_SEQS")
# our engine: Fast first as the backend runs (step 1), and the CUDA backend's default prefill cap
[ "$MODEL" != echo ] && [ "$WAITING_BY_CLASS" = 1 ] && SIMFLAGS+=(--waiting-by-class)
[ "$DEVICE" != cpu ] && SIMFLAGS+=(--max-prefill-tokens-while-decoding 256)
# echo backends admit their waiting requests Fast first (always); the simulator too
[ "$MODEL" = echo ] && SIMFLAGS+=(--waiting-by-class --slot-model)
SIMFLAGS+=("${OVFLAGS[@]}" "${DLFLAGS[@]}")
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
timeout 200 $PY -m bench.serving.slo_control --url http://127.0.0.1:$PORT_A --control-url http://127.0.0.1:$PORT_B \
    ${CONTROL_FIRST:+--control-first} --slo-ttft-ms "$SLO" --rate "$RATE" --num-requests "$N" --input-len "$INPUT" \
    --output-len "$OUTPUT" --seed "$SEED" --probe-every "$PROBE_EVERY" --json "$OUT/slo_control.json" \
    --records "$OUT/records_a.jsonl" 2>&1 | tee "$OUT/slo_control.txt"
curl -s localhost:$PORT_A/metrics | grep -E "^tidegate_(slo|admission|window|refused)" > "$OUT/metrics_a.txt"

# 5. decision fidelity of A's windows and admission decisions
FFLAGS=(--backends "$BACKENDS" --placement "$PLACEMENT" "${WINFLAGS[@]}")
[ -n "$MAX_NUM_SEQS" ] && FFLAGS+=(--max-num-seqs "$MAX_NUM_SEQS")
[ "$MODEL" = echo ] && FFLAGS+=(--waiting-by-class --slot-model)
[ "$MODEL" != echo ] && [ "$WAITING_BY_CLASS" = 1 ] && FFLAGS+=(--waiting-by-class)
FFLAGS+=("${OVFLAGS[@]}" "${DLFLAGS[@]}")
$PY -m bench.simulator.decision_fidelity "$OUT/decisions_a.jsonl" --slo-ttft-ms "$SLO" "${COST[@]}" \
    "${FFLAGS[@]}" > "$OUT/decision_fidelity.json" 2>&1
cat "$OUT/decision_fidelity.json"
