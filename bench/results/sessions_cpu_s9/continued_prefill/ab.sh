#!/usr/bin/env bash
# A/B of the continued-prefill path on the engine: MODE=new (default) or old (threshold huge)
cd /work/main
export PYTHONUNBUFFERED=1
MODEL=${MODEL:-deepseek-coder-1.3b}
O=/tmp/s30/ab_${TAG}_$MODE; mkdir -p $O
LIM=32; [ "$MODE" = old ] && LIM=1000000000
LF=(--load-format dummy); [ -d "$MODEL" ] && LF=()
.venv/bin/python -c "import sys, backend.kernels.cpu.attention as a; a.CONTINUED_MIN_QUERY=$LIM; from gateway.tidegate_cli import main; sys.exit(main(sys.argv[1:]))" \
  backend --listen ipc:///tmp/s30-ab.sock --model $MODEL "${LF[@]}" --device cpu --num-blocks 200 --max-model-len $CTX --step-log $O/steps.jsonl > $O/backend.log 2>&1 & B=$!
.venv/bin/python -m gateway.tidegate_cli serve --backend ipc:///tmp/s30-ab.sock --port 18632 --startup-timeout 600 --heartbeat-timeout 120 > $O/gw.log 2>&1 & G=$!
for i in $(seq 300); do curl -sf localhost:18632/health >/dev/null && break; sleep 1; done
timeout 400 .venv/bin/python -m bench.serving.session_ttft --url http://127.0.0.1:18632 --context $CTX --first-tokens 256 --turns 4 --repeats 1 --vocab $VOCAB --seed 1 --json $O/a.json 2> $O/a.log | tail -3
kill $G; kill $B; wait $G $B 2>/dev/null
