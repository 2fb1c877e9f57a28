#!/bin/bash
cd /work/main
out=/tmp/slo/fid; mkdir -p $out
port=18451
serve_run() { # label, bench args..., -- serve args
  label=$1; shift
  bargs=(); while [ "$1" != "--" ]; do bargs+=("$1"); shift; done; shift
  rm -f $out/dec_$label.jsonl
  .venv/bin/tidegate serve --port $port --decision-log $out/dec_$label.jsonl "$@" > $out/serve_$label.log 2>&1 &
  pid=$!
  for i in $(seq 1 240); do curl -s localhost:$port/health >/dev/null 2>&1 && break; sleep 0.5; done
  echo "load $(cut -d' ' -f1-3 /proc/loadavg)" > $out/load_$label.txt
  .venv/bin/tidegate bench serve --url http://127.0.0.1:$port "${bargs[@]}" --json $out/bench_$label.json > $out/bench_$label.txt 2>&1
  echo "load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/load_$label.txt
  kill $pid; wait $pid 2>/dev/null
}
# 1. deterministic part: idle flush off, 20 ms window, 400 req/s Poisson (windows ~8)
serve_run det --num-requests 2000 --rate 400 --input-len 16 --output-len 1 --seed 3 -- --model echo --no-idle-flush --min-latency-ms 20
.venv/bin/python -m bench.simulator.decision_fidelity $out/dec_det.jsonl --no-idle-flush --min-latency-ms 20 > $out/fid_det.json 2>&1
# 2. the default window, idle flush on, c=64 closed loop (timing-dependent)
serve_run idle --num-requests 3000 --rate inf --max-concurrency 64 --input-len 16 --output-len 1 --seed 4 -- --model echo
.venv/bin/python -m bench.simulator.decision_fidelity $out/dec_idle.jsonl > $out/fid_idle.json 2>&1
