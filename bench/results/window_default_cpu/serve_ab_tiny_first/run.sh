#!/bin/bash
# usage: ab.sh OUTDIR ROUNDS  -- alternates the old and new window defaults, same workloads
cd /work/main
out=$1; rounds=${2:-2}; mkdir -p $out
port=18431
run() {  # $1 label, rest: serve flags
  label=$1; shift
  .venv/bin/tidegate serve --port $port "$@" > $out/serve_$label.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do curl -s localhost:$port/health >/dev/null 2>&1 && break; sleep 0.5; done
  cat /proc/loadavg > $out/load_$label.txt
  .venv/bin/tidegate bench serve --url http://127.0.0.1:$port --num-requests 1500 --rate inf --max-concurrency 64 --input-len 16 --output-len 2 --seed 1 --json $out/short_c64_$label.json > $out/short_c64_$label.txt 2>&1
  ps -o pid,ppid,cputime,args -p $pid --ppid $pid > $out/cpu_mid_$label.txt
  .venv/bin/tidegate bench serve --url http://127.0.0.1:$port --num-requests 400 --rate 30 --input-len 32 --output-len 16 --seed 2 --json $out/poisson30_$label.json > $out/poisson30_$label.txt 2>&1
  curl -s localhost:$port/metrics | grep -E "^tidegate_window_size_mean|^tidegate_batches_total|^process_cpu_seconds_total" > $out/metrics_$label.txt
  cat /proc/loadavg >> $out/load_$label.txt
  ps -o pid,ppid,cputime,args -p $pid --ppid $pid > $out/cpu_$label.txt
  kill $pid; wait $pid 2>/dev/null
}
for r in $(seq 1 $rounds); do
  run old$r --target-throughput 8000 --min-latency-ms 5
  run new$r --target-throughput 250 --min-latency-ms 10
done
