#!/usr/bin/env bash
# Issue 35 (session 31): the decode-only steps' excess over the profile, measured on ONE machine.
# Live decode-only steps have read 1.5-3 % over the profile's device time at d off the grid pass's
# points on every H100 part (sessions 21, 29, 31) and on the H200's 6.7B (session 16). Session 29
# traced it to the zeroed KV pool with replays run in other device calls than the live part (so on
# other machines); session 31's profile over a filled pool measured the decode points +0.15 % over
# the zeroed profile's on average and left the live excess as it was. This call runs everything on
# one machine, ABA, so a card's own speed cancels:
#   1. a short grid part (one seed, LOADS 0.8,0.95 by default): live steps and their profile;
#   2. 700 of its live steps as compositions (decode_replay_prep.py, on the device: scipy is there);
#   3. replay_live over them: zeroed pool, filled pool, zeroed again (3 pipelined passes each; the first
#      also paused, as the profile times its points).
#   OUT=$OUT PART=6.7b-fp8 bash scripts/gpu_decode_same_machine.sh     (~350 s on the H100)
#   OUT=/tmp/sm PART=cpu bash scripts/gpu_decode_same_machine.sh       (the CPU check, tiny)
# Read: python bench/results/fidelity_h100fp8_s29/decode_replay_read.py $OUT/compositions.json $OUT/replay_<v>.json
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
PART=${PART:-6.7b-fp8}
mkdir -p "$OUT"
if [ "$PART" = cpu ]; then DEV=cpu; M=tiny; Q=none; KV=(); N_STEPS=${N_STEPS:-60}
else DEV=cuda; Q=none; KV=(); case "$PART" in *fp8*) Q=fp8 ;; esac
  case "$PART" in *kvint4*) KV=(--kv-cache-dtype int4-fp8) ;; esac
  case "$PART" in 33b*) M=deepseek-coder-33b ;; *) M=deepseek-coder-6.7b ;; esac
  N_STEPS=${N_STEPS:-700}; fi
export SEEDS=${SEEDS:-0} LOADS=${LOADS:-0.8,0.95}
[ "$PART" = cpu ] && unset LOADS
echo "$(date -u +%T) part $PART seeds $SEEDS loads ${LOADS:-default}"
OUT=$OUT PART=$PART timeout -s INT "${PART_S:-330}" bash scripts/gpu_fidelity_grid_run.sh > "$OUT/part_log.txt" 2>&1
tail -3 "$OUT/part_log.txt"
PY=${PY:-python3}
[ -d /tmp/site ] && export PYTHONPATH=$PWD:/tmp/site:${PYTHONPATH:-} || export PYTHONPATH=$PWD:${PYTHONPATH:-}
$PY bench/results/fidelity_h100fp8_s29/decode_replay_prep.py "$OUT/$PART" "$OUT/compositions.json" "$N_STEPS" 0.3 \
  || { echo "no compositions"; exit 1; }
for v in zeros fill zeros2; do
  # the first replay also times each step paused behind a spin, as the profile times its points
  f="--paused-repeats 0"; [ "$v" = zeros ] && f="--paused-repeats 1 --pause-ms 30"; [ "$v" = fill ] && f="$f --fill-kv"
  echo "$(date -u +%T) replay $v"
  # shellcheck disable=SC2086
  timeout "${REPLAY_S:-120}" $PY -m bench.engine.replay_live --model "$M" --device "$DEV" --quantization "$Q" "${KV[@]}" \
      --steps "$OUT/compositions.json" --out "$OUT/replay_$v.json" --passes 3 $f \
      > "$OUT/replay_$v.log" 2>&1 || { echo "replay $v failed:"; tail -5 "$OUT/replay_$v.log"; }
done
for v in zeros fill zeros2; do
  [ -f "$OUT/replay_$v.json" ] && { echo "== $v"; $PY bench/results/fidelity_h100fp8_s29/decode_replay_read.py \
      "$OUT/compositions.json" "$OUT/replay_$v.json"; }
done
echo "$(date -u +%T) done"
