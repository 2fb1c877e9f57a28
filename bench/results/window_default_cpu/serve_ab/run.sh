#!/bin/bash
# old (8000) vs new (250) window default, alternating; echo and tiny-coder backends
cd /work/main
out=$1; rounds=${2:-2}; mkdir -p $out
port=18441
cpu() { for p in "$@"; do awk '{print $14+$15}' /proc/$p/stat; done | paste -sd' '; }
run() {  # $1 label, $2 model, rest: serve flags
  label=$1; model=$2; shift 2
  .venv/bin/tidegate serve --port $port --model $model "$@" > $out/serve_$label.log 2>&1 &
  pid=$!
  for i in $(seq 1 240); do curl -s localhost:$port/health >/dev/null 2>&1 && break; sleep 0.5; done
  child=$(pgrep -P $pid | head -1)
  l0=$(cut -d' ' -f1 /proc/loadavg); c0="$(cpu $pid $child)"
  n=1500; [ $model = echo ] && n=4000
  .venv/bin/tidegate bench serve --url http://127.0.0.1:$port --num-requests $n --rate inf --max-concurrency 64 --input-len 16 --output-len 2 --seed 1 --json $out/c64_$label.json > $out/c64_$label.txt 2>&1
  c1="$(cpu $pid $child)"; l1=$(cut -d' ' -f1 /proc/loadavg)
  curl -s localhost:$port/metrics | grep -E "^tidegate_window_size_mean|^tidegate_batches_total" | tr '\n' ' ' > $out/metrics_$label.txt
  echo "ticks_before $c0 ticks_after $c1 load $l0 $l1 requests $n" >> $out/metrics_$label.txt
  kill $pid; wait $pid 2>/dev/null
}
for r in $(seq 1 $rounds); do
  run echo_old$r echo --target-throughput 8000
  run echo_new$r echo
  run tiny_old$r models/tiny-coder --target-throughput 8000
  run tiny_new$r models/tiny-coder
done
