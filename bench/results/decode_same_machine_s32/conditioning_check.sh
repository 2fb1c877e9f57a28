#!/usr/bin/env bash
# Issue 35, session 32: the decode-conditioning fix checked on one card in about two minutes. Two small profiles
# (`backend profile`, the grid's decode batches 16 / 32 / 64 beside one mixed point each, the decode-bucket points
# between them, contexts 512 / 576 / 640), one with `--decode-conditioning on` (the default) and one `off`, then
# `replay_live`'s paused runs of the same decode shapes at the middle context (the harness the live steps agree
# with: README section 1). conditioning_read.py prints each profile's decode points over the replay, grid pass and
# bucket pass apart: the fix is right if the conditioned bucket points read the replay as the grid's points do.
#   OUT=$OUT bash bench/results/decode_same_machine_s32/conditioning_check.sh          (the 6.7B FP8, ~2 min)
#   OUT=/tmp/cc DEV=cpu bash bench/results/decode_same_machine_s32/conditioning_check.sh   (the CPU form, tiny)
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
PY=${PY:-python3}
if [ -d /tmp/site ]; then export PYTHONPATH=$PWD:/tmp/site; else export PYTHONPATH=$PWD; fi
if ! $PY -c 'import zmq, google.protobuf' 2>/dev/null && [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
fi
if [ "${DEV:-cuda}" = cpu ]; then
  M=(--model tiny --device cpu); Q=none; DS=1,2,4; PT=0,32; CS=16,24,32; RD=1,2,3,4; C=24
else
  M=(--model deepseek-coder-6.7b --device cuda); Q=${Q:-fp8}; DS=16,32,64; PT=0,1024; CS=512,576,640
  RD=16,17,18,24,25,26,32,33,34,48,49,50,64; C=576
fi
for v in on off; do
  echo "$(date -u +%T) profile, conditioning $v"
  $PY -m gateway.tidegate_cli backend profile "${M[@]}" --quantization "$Q" --repeats 3 --warmup 1 --pause-ms 60 \
      --device-time on --decode-batch-sizes "$DS" --prefill-tokens "$PT" --context-lens "$CS" \
      --packed-prefill-seqs "" --decode-spread-points off --block-order-check off --decode-conditioning "$v" \
      --out "$OUT/profile_$v.json" > "$OUT/profile_$v.log" 2>&1 || { echo "profile $v failed:"; tail -5 "$OUT/profile_$v.log"; }
done
$PY - "$RD" "$C" "$OUT/compositions.json" <<'PYEOF'
import json, sys
ds, c = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2])
json.dump({"steps": [{"i": k, "ctxs": [c] * d, "chunks": []} for k, d in enumerate(ds)]}, open(sys.argv[3], "w"))
PYEOF
echo "$(date -u +%T) replay"
$PY -m bench.engine.replay_live "${M[@]}" --quantization "$Q" --steps "$OUT/compositions.json" --out "$OUT/replay.json" \
    --passes 1 --paused-repeats 3 --pause-ms 30 > "$OUT/replay.log" 2>&1 || { echo "replay failed:"; tail -5 "$OUT/replay.log"; }
$PY bench/results/decode_same_machine_s32/conditioning_read.py "$OUT" "$C"
echo "$(date -u +%T) done"
