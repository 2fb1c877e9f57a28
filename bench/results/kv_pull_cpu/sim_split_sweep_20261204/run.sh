#!/usr/bin/env bash
# Issue 34, disaggregated Slow prefill in the simulator (33B roofline on the H200, 512/128 streams
# at 4 req/s + 8K-token Slow prompts at 0.5 req/s, 1,200 streams = 300 s, seeds 0-2): the decode
# backend's prefill cap while decoding (cap), the split threshold (min) and margin (g), the link
# (L, GB/s); the recipe's KV pool (blocks; scripts/gpu_kv_pull_run.sh BLOCKS is 2048 per backend,
# the cost model's room beside the weights 14,290), also over 30 s (the call's DURATION, 5 seeds);
# the two backends time-sharing one GPU (shared K: decode steps and the prefill K x slower while a
# prefill runs). One JSON per run under runs/ (runs30s/), summary.txt: means over seeds and the
# [min-max] of p99/p50. PARTS="base blocks shared" (default all); ~6 min on one core:
#   bash bench/results/kv_pull_cpu/sim_split_sweep_20261204/run.sh
set -eu
cd "$(dirname "$0")"
D=$(pwd)
cd ../../../..
PY=${PY:-.venv/bin/python}
PARTS=${PARTS:-base blocks shared}
mkdir -p "$D/runs" "$D/runs30s"
run() {  # $1: name; the rest: flags
  local name=$1; shift
  for s in 0 1 2; do
    $PY -m sims.kv_pull_study split --num-requests 1200 --seed $s --json "$D/runs/${name}_s$s.json" "$@" > /dev/null
  done
}
if [[ " $PARTS " == *" base "* ]]; then
  for cap in 0 128 256; do run one_cap$cap --modes one --prefill-cap $cap; done
  for cap in 0 128 256; do for g in 0.5 3 100; do
    run split_cap${cap}_min4096_g${g} --modes split --link-gbps 400 --prefill-cap $cap --split-margin $g
  done; done
  for cap in 128 256; do for g in 0.5 3 100; do
    run split_cap${cap}_min512_g${g} --modes split --link-gbps 400 --prefill-cap $cap --split-min-tokens 512 --split-margin $g
  done; done
  run split_cap64_min4096_g100 --modes split --link-gbps 400 --prefill-cap 64 --split-margin 100
  for L in 0.32 50 2000; do
    run split_cap128_min4096_g100_L$L --modes split --link-gbps $L --prefill-cap 128 --split-margin 100
  done
fi
if [[ " $PARTS " == *" blocks "* ]]; then
  for b in 2048 4096 6144; do
    run both_cap128_g100_blocks$b --prefill-cap 128 --split-margin 100 --link-gbps 400 --kv-blocks $b
  done
  for b in 2048 4096; do for s in 0 1 2 3 4; do
    $PY -m sims.kv_pull_study split --num-requests 120 --seed $s --prefill-cap 128 --split-margin 100 \
        --link-gbps 400 --kv-blocks $b --json "$D/runs30s/both_cap128_g100_blocks${b}_s$s.json" > /dev/null
  done; done
fi
if [[ " $PARTS " == *" shared "* ]]; then
  for K in 1.25 1.5 2; do
    run split_cap128_min4096_g100_shared$K --modes split --link-gbps 400 --prefill-cap 128 --split-margin 100 --shared-gpu $K
    run split_cap128_min512_g3_shared$K --modes split --link-gbps 400 --prefill-cap 128 --split-min-tokens 512 --split-margin 3 --shared-gpu $K
  done
fi
$PY - "$D" <<'PY' | tee "$D/summary.txt"
import collections, glob, json, re, sys
import numpy as np
runs = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/runs/*.json") + glob.glob(sys.argv[1] + "/runs30s/*.json")):
    name = ("30s_" if "/runs30s/" in f else "") + re.sub(r"_s\d+\.json$", "", f.rsplit("/", 1)[1])
    for r in json.load(open(f))["runs"]:
        both = name.startswith(("both", "30s_both"))
        runs[name + (("_one" if r["mode"] == "one backend" else "_split") if both else "")].append(r)
print("run | ITL p50 | ITL p99 | p99/p50 (min-max) | long TTFT p50/p99 | streams' TTFT p50/p99 | out tok/s | split")
for k, rs in runs.items():
    m = lambda f: float(np.mean([f(r) for r in rs]))
    q = [r["itl_p99_over_p50"] for r in rs]
    print(f"{k} | {m(lambda r: r['itl_ms']['p50']):.2f} | {m(lambda r: r['itl_ms']['p99']):.2f} | "
          f"{np.mean(q):.2f} ({min(q):.2f}-{max(q):.2f}) | {m(lambda r: r['slow_ttft_ms']['p50']):.0f}/"
          f"{m(lambda r: r['slow_ttft_ms']['p99']):.0f} | {m(lambda r: r['stream_ttft_ms']['p50']):.0f}/"
          f"{m(lambda r: r['stream_ttft_ms']['p99']):.0f} | {m(lambda r: r['output_throughput']):.0f} | "
          f"{m(lambda r: (r['kv_pull'] or {}).get('split', 0)):.1f}")
PY
