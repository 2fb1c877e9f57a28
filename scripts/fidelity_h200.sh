#!/usr/bin/env bash
# Issue 18 on the H200, in one device call: `tidegate sim validate` (profile, live service with a
# decision log and the backend's step log, simulation of the schedule and replay of the recorded
# arrivals) on one preset. Results under $OUT (at most 8 files come back): validate JSON, its
# log, the profile, the decision log, the step log. Scaled to the session's device grant.
#   MODEL=deepseek-coder-33b LOADS=0.5,0.8,0.95 SEEDS=0,1,2 N=100 BUDGET_S=330 bash scripts/fidelity_h200.sh
# The mixed chat/code shape (lengths as `sim validate --input-len` takes them):
#   MODEL=deepseek-coder-6.7b IN=lognormal:512:0.8 OUTLEN=lognormal:128:0.7 TAG=6.7b-mixed ...
# FP8 weights (profile and live backend both): SERVE_ARGS=--engine-arg=--quantization=fp8 TAG=33b-fp8 ...
# The same on the CPU (checks the command, not the numbers):
#   OUT=/tmp/fid MODEL=tiny DEVICE=cpu IN=16 OUTLEN=8 N=20 RATES=4 SEEDS=0 bash scripts/fidelity_h200.sh
set -uo pipefail
: "${OUT:?}"
MODEL=${MODEL:-deepseek-coder-33b}
DEVICE=${DEVICE:-cuda}
IN=${IN:-512}
OUTLEN=${OUTLEN:-128}
N=${N:-100}
SEEDS=${SEEDS:-0,1,2}
LOADS=${LOADS:-0.5,0.8,0.95}
BUDGET_S=${BUDGET_S:-330}
# idle before each timed prefill step of the profile: measured back to back, compute-bound steps
# ran at sustained-load clocks, 7-12% slower than the serving loop runs them (issue 18)
PAUSE_MS=${PAUSE_MS:-60}
# the profile's device-timed repetitions (issue 35, session 17: sim validate --profile-device-time);
# DEVICE_TIME=off saves their ~+60 s on the 33B where a call's budget is tight
DEVICE_TIME=${DEVICE_TIME:-on}
TAG=${TAG:-$(echo "$MODEL" | sed 's/deepseek-coder-//')}
if [ -d .whl ] && ! python3 -c 'import zmq, google.protobuf' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} || exit 1
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
load_args=(--loads "$LOADS")
[ -n "${RATES:-}" ] && load_args=(--rates "$RATES")
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null | tee "$OUT/gpu_$TAG.txt"
# SM clock and power every 100 ms, for the whole command: which clocks the profile's steps and the
# live steps ran at (the step log's "t" is the same wall clock)
smi_pid=
if command -v nvidia-smi >/dev/null; then
  q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
  # why the clock is below its maximum (power cap, thermal...), where this driver names it
  for f in clocks_event_reasons.active clocks_throttle_reasons.active; do
    nvidia-smi --query-gpu=$f --format=csv,noheader >/dev/null 2>&1 && { q=$q,$f; break; }
  done
  echo "# $q" >"$OUT/smi_$TAG.csv"
  nvidia-smi --query-gpu=$q --format=csv,noheader,nounits -lms 100 >>"$OUT/smi_$TAG.csv" 2>&1 &
  smi_pid=$!
fi
# PROFILE_FROM=<profile.json>: that profile instead of measuring one (no --reprofile): the live runs
# are as with a fresh one where RATES fixes the rates; only the replay reads it. For a short call
# that repeats an earlier part's live runs (live against live: scripts/GPU_RUNS.md row 5)
reprofile=(--reprofile)
if [ -n "${PROFILE_FROM:-}" ]; then
  [ -f "$PROFILE_FROM" ] || { echo "PROFILE_FROM=$PROFILE_FROM: no such profile" >&2; exit 2; }
  cp "$PROFILE_FROM" "$OUT/profile_$TAG.json" && reprofile=() || exit 1
  # PROFILE_CHECK (session 38): re-measure ~30 of its points on this card first (~30-60 s); cards of one
  # kind differ (two H100s: decode 3.3 %, prefill 1.4 %), and outside the tolerance a whole profile of
  # this card is measured instead (reprofile, the default), or the check is recorded only (warn); off: none
  PROFILE_CHECK=${PROFILE_CHECK:-reprofile}
  [ "$PROFILE_CHECK" = off ] || reprofile=(--profile-check "$PROFILE_CHECK")
  echo "profile: $PROFILE_FROM (not measured in this call unless its check fails: PROFILE_CHECK=$PROFILE_CHECK)"
fi
# A device call's stop signal (`timeout -s INT` around the part) reaches this shell and the log's tee,
# not validate: the inner `timeout` runs it in a process group of its own. Before session 37 that
# signal killed the tee alone, validate's next line hit a broken pipe, and the part ended with no
# JSON (session 36's 33B FP8, all nine runs done; session 37's H100 6.7B). Now the tee ignores it and
# this shell passes it on as the TERM on which validate scores and writes the runs done so far.
rm -f "$OUT/.validate_rc" "$OUT/.validate_pid"
{
  timeout "$BUDGET_S" python3 -m gateway.tidegate_cli sim validate --model "$MODEL" --device "$DEVICE" \
    --input-len "$IN" --output-len "$OUTLEN" --num-requests "$N" --seeds "$SEEDS" "${load_args[@]}" \
    --profile "$OUT/profile_$TAG.json" "${reprofile[@]}" --profile-repeats 3 --profile-warmup 1 \
    --profile-pause-ms "$PAUSE_MS" --profile-device-time "$DEVICE_TIME" \
    --warmup-requests 10 --settle-s 0.5 \
    --decision-log "$OUT/decisions_$TAG.jsonl" --step-log "$OUT/steps_$TAG.jsonl" ${SERVE_ARGS:-} \
    --json "$OUT/validate_$TAG.json" &
  # its pid for the trap below (session 38: a `pkill -f` on the command line found nothing once on a busy
  # CI machine, and the cut part ran on to the end); `timeout` passes the TERM on to validate
  echo $! > "$OUT/.validate_pid"
  wait $!
  echo $? > "$OUT/.validate_rc"
} 2>&1 | (trap '' INT TERM; exec tee "$OUT/validate_$TAG.log") &
pipe_pid=$!
stop_validate() {
  echo "stop signal: passing it on to validate as TERM" >&2
  local i
  for i in 1 2 3 4 5 6 7 8 9 10; do  # the pid file is written a moment after the start
    [ -s "$OUT/.validate_pid" ] && { kill -TERM "$(cat "$OUT/.validate_pid")" 2>/dev/null; return; }
    sleep 0.1
  done
}
trap stop_validate INT TERM
while kill -0 "$pipe_pid" 2>/dev/null; do wait "$pipe_pid"; done
trap - INT TERM
echo "rc $(cat "$OUT/.validate_rc" 2>/dev/null || echo '?')"
rm -f "$OUT/.validate_rc" "$OUT/.validate_pid"
[ -n "$smi_pid" ] && kill "$smi_pid" 2>/dev/null
