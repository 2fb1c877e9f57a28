#!/usr/bin/env bash
# Issue 30 on one H200, in one device call: TTFT of a 16K-token session's cached follow-up turns
# vs recomputing them (33B preset, dummy bf16 weights), one backend with a host KV tier:
#   a. no pressure: follow-ups hit the GPU prefix cache
#   b. unrelated prompts (PRESSURE tokens, more than the GPU pool) between turns: the session's
#      blocks are evicted to the host tier and copied back (or recomputed)
#   c. as b, each turn pinned (cache_control ttl 5m): the pin keeps the prefix on the GPU
#
#   bash scripts/gpu_sessions_run.sh                                  # writes under $OUT
#   MODEL=models/tiny-coder DEVICE=cpu CONTEXT=2048 FIRST=256 NUM_BLOCKS=300 HOST_GIB=0 \
#       PRESSURE=6000 TURNS=6 PTURNS=4 REPEATS=1 VOCAB=8192 bash scripts/gpu_sessions_run.sh  # CPU check
#
# TTFT is the first chunk carrying a token (session_ttft: return_token_ids); rows also keep the
# first chunk with text (text_ms: the 12-03 run's figure, which waited for the whole 16-token
# stream with the preset's byte-level tokenizer) and the end. metrics_{a,b,c}.txt after each run:
# the host tier's hit tokens and the pins (c's follow-ups should add no host hits: pinned blocks
# stay on the GPU); steps.jsonl: the backend's step log (written when it stops).
#
# Device time: start-up <= 150 s (33B dummy), a <= 150 s (16 turns x 2 repeats, each turn and a
# cold twin), b and c <= 150 s each (5 rounds of PRESSURE = 70K tokens of prefill at ~10K
# tokens/s). Every step has its own timeout; the JSONs are under $OUT.
set -u
OUT=${OUT:-out/gpu_sessions}
MODEL=${MODEL:-deepseek-coder-33b}
DEVICE=${DEVICE:-cuda}
CONTEXT=${CONTEXT:-16384}
FIRST=${FIRST:-2048}
TURNS=${TURNS:-16}      # ~950 new tokens a turn: follow-ups hold 2K..15K of their prompt
REPEATS=${REPEATS:-2}
NUM_BLOCKS=${NUM_BLOCKS:-4096}      # 64K tokens of GPU KV: pressure stays cheap
HOST_GIB=${HOST_GIB:-32}
PRESSURE=${PRESSURE:-70000}
PTURNS=${PTURNS:-6}     # turns of the pressure runs (b, c): each turn waits for PRESSURE tokens
VOCAB=${VOCAB:-32000}
source "$(dirname "$0")/gpu_common.sh"
trap cleanup EXIT INT TERM
SOCK=ipc:///tmp/tg-sessions-$$.sock
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null; git log -1 --oneline; } \
    > "$OUT/machine.txt"

LOADFMT=(--load-format dummy)
[ -d "$MODEL" ] && LOADFMT=()
$TG backend --listen "$SOCK" --model "$MODEL" "${LOADFMT[@]}" --device "$DEVICE" \
    --num-blocks "$NUM_BLOCKS" --host-kv-gib "$HOST_GIB" --max-model-len "$CONTEXT" \
    --step-log "$OUT/steps.jsonl" > "$OUT/backend.log" 2>&1 &
pids+=($!)
$TG serve --backend "$SOCK" --port 18530 --startup-timeout 600 --heartbeat-timeout 120 \
    > "$OUT/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do curl -sf localhost:18530/health >/dev/null && break; sleep 1; done
curl -sf localhost:18530/health >/dev/null || { echo "gateway not healthy"; tail -20 "$OUT/backend.log"; exit 1; }

metrics() {
  sleep 1.5  # a LoadReport after the last request (host hits, pins)
  curl -sf localhost:18530/metrics | grep -E \
      '^tidegate_(backend_pin|pin_|session|backend_host_kv|backend_swap)|^vllm:prefix_cache' > "$OUT/$1"
}
ARGS=(--url http://127.0.0.1:18530 --context "$CONTEXT" --first-tokens "$FIRST" --turns "$TURNS"
      --repeats "$REPEATS" --vocab "$VOCAB")
timeout 150 $PY -m bench.serving.session_ttft "${ARGS[@]}" --seed 1 --json "$OUT/a_cached.json" \
    2> "$OUT/a_cached.log"
metrics metrics_a.txt
timeout 150 $PY -m bench.serving.session_ttft "${ARGS[@]}" --seed 2 --repeats 1 --turns "$PTURNS" \
    --pressure-tokens "$PRESSURE" --json "$OUT/b_host_tier.json" 2> "$OUT/b_host_tier.log"
metrics metrics_b.txt
timeout 150 $PY -m bench.serving.session_ttft "${ARGS[@]}" --seed 3 --repeats 1 --turns "$PTURNS" \
    --pressure-tokens "$PRESSURE" --pin-ttl-s 300 --json "$OUT/c_pinned.json" 2> "$OUT/c_pinned.log"
metrics metrics_c.txt
for f in a_cached b_host_tier c_pinned; do
  [ -f "$OUT/$f.json" ] && $PY -c "import json; d=json.load(open('$OUT/$f.json')); print('$f', \
'follow-up TTFT p50 %.1f ms, recompute %.1f ms, x%.2f' % (d['followup_ttft_p50_ms'], \
d['recompute_ttft_p50_ms'], d['speedup']) + '; to first text %.1f vs %.1f ms, x%.2f' % ( \
d['followup_text_p50_ms'], d['recompute_text_p50_ms'], d['text_speedup']))"
done | tee "$OUT/summary.txt"
grep -h host_kv_hit "$OUT"/metrics_?.txt | tee -a "$OUT/summary.txt"
