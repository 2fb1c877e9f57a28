#!/usr/bin/env bash
# Issue 19's multi-GPU run (not yet run: no machine with >= 2 GPUs was lent). One device call on
# nvidia-h200-x2 (TP=1,2) or -x4 (TP=1,2,4), ~8 minutes:
#
#   run(kind="nvidia-h200-x4", carry=[".carry-tp", ".whl"],
#       command="cd .carry-tp && bash scripts/gpu_tp_run.sh")       # writes under $OUT
#   DEVICE=cpu MODEL=<a small HF dir> TPS="1 2" BATCHES=1,4 CONTEXT=32 SKIP_SERVING=1 \
#       bash scripts/gpu_tp_run.sh                                  # the CPU check of the script
#
# 1. tests on the GPUs: tests/test_tensor_parallel.py -m gpu (TP=2 over NCCL with CUDA graphs
#    equals TP=1; greedy tokens through `tidegate backend --tensor-parallel-size 2`);
# 2. `python -m bench.engine.tensor_parallel` at each TP size: decode ms/step at each batch
#    (33B preset, dummy bf16 weights, CUDA graphs), its floor (weights/tp + KV/tp over the copy
#    bandwidth measured in the same run + the all-reduces measured in the same run, in a graph),
#    and the simulator's plan for the same layout;
# 3. the goal lines (tp_goals.txt): TP=2 batch-1 >= 80% of its floor; TP=2 >= 1.7x TP=1 tok/s at
#    batch 1; plan within 10% of the measured TP=2 step (and TP=1, TP=4 beside it);
# 4. unless SKIP_SERVING=1: issue 11's serving workloads at TP=2 next to TP=1
#    (scripts/gpu_serving_run.sh with CONFIGS="tp1= tp2=--tensor-parallel-size%2").
#
# What to do with the output: BENCHMARKS.md "Issue 19" (goal lines, the TP=1/2/4 rows, the
# all-reduce figures); if the plan is off by > 10%, correct sims (plan.py's all-reduce latency
# NVLINK_LATENCY_S in sims/hardware.py and the per-step overhead are the two free terms: the
# bench's all_reduce graph_s gives the first directly).
set -u
OUT=${OUT:-out/gpu_tp}
MODEL=${MODEL:-deepseek-coder-33b}
DEVICE=${DEVICE:-cuda}
TPS=${TPS:-"1 2 4"}
BATCHES=${BATCHES:-1,8,32,128}
CONTEXT=${CONTEXT:-512}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
PY=${PY:-python3}
[ -x .venv/bin/python ] && [ "$DEVICE" = cpu ] && PY=.venv/bin/python
if ! $PY -c 'import zmq' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
[ -e models ] || { [ -d ../models ] && ln -s ../models models; }

{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv \
    && nvidia-smi topo -m
  $PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"gpus", torch.cuda.device_count())'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
NGPU=$($PY -c 'import torch; print(torch.cuda.device_count())')

if [ "$DEVICE" != cpu ]; then
  timeout 240 $PY -m pytest -x -q -m gpu tests/test_tensor_parallel.py > "$OUT/tests.txt" 2>&1
  echo "gpu tests exit $?"; tail -5 "$OUT/tests.txt"
fi

for tp in $TPS; do
  if [ "$DEVICE" != cpu ] && [ "$tp" -gt "$NGPU" ]; then echo "skip tp=$tp ($NGPU GPUs)"; continue; fi
  timeout 300 $PY -m bench.engine.tensor_parallel --model "$MODEL" --device "$DEVICE" --tp "$tp" \
      --batches "$BATCHES" --context "$CONTEXT" --out "$OUT/tp$tp.json" ${BENCH_ARGS:-}
  echo "bench tp=$tp exit $?"
done

$PY - "$OUT" > "$OUT/tp_goals.txt" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {int(p.stem[2:]): json.loads(p.read_text()) for p in out.glob("tp*.json")}
try:  # the simulator's plan for the same layout (tp GPUs, one stage), beside each measured row
    from sims.hardware import get_gpu
    from sims.model_shape import load_model_shape
    from sims.plan import PlanConfig, evaluate
    import os
    for tp, res in runs.items():
        shape, gpu = load_model_shape(res["model"]), get_gpu(os.environ.get("GPU", "h200"))
        for r in res["decode"]:
            p = evaluate(shape, gpu, tp, tp, 1, PlanConfig(batch=r["batch"], context_len=res["context"]))
            r["plan_tpot_ms"] = p.tpot_ms if res["device"].startswith("cuda") else None
            r["plan_error"] = None if r["plan_tpot_ms"] is None else p.tpot_ms / r["ms_per_step"] - 1
except Exception as exc:  # noqa: BLE001 -- the measured rows still print
    print("no plan:", exc)
    for res in runs.values():
        for r in res["decode"]:
            r["plan_tpot_ms"] = r["plan_error"] = None
def row(tp, batch):
    return next((r for r in runs.get(tp, {}).get("decode", []) if r["batch"] == batch), None)
for tp in sorted(runs):
    for r in runs[tp]["decode"]:
        ar = next(a for a in runs[tp]["all_reduce"] if a["tokens"] == r["batch"])
        plan = r["plan_tpot_ms"]
        print(f"tp={tp} batch={r['batch']:4d}: {r['ms_per_step']:8.3f} ms  {r['tokens_per_s']:9.1f} tok/s  "
              f"floor {r['floor_ms']:.3f} ms ({r['fraction_of_floor']:.1%})  plan sent in "
              f"{r['plan_send_ms']:.3f} ms  all-reduce "
              f"{ar['graph_s'] * 1e6:.1f} us (graph) {ar['eager_s'] * 1e6:.1f} us (eager)  plan "
              + (f"{plan:.3f} ms ({r['plan_error']:+.1%})" if plan else "-"))
t1, t2 = row(1, 1), row(2, 1)
if t2:
    print(f"GOAL TP=2 batch-1 >= 80% of its floor: {t2['fraction_of_floor']:.1%} -> "
          f"{'met' if t2['fraction_of_floor'] >= 0.8 else 'NOT met'}")
    if t2.get("plan_error") is not None:
        print(f"GOAL plan within 10% of the TP=2 step: {t2['plan_error']:+.1%} -> "
              f"{'met' if abs(t2['plan_error']) <= 0.10 else 'NOT met'}")
if t1 and t2:
    x = t2["tokens_per_s"] / t1["tokens_per_s"]
    print(f"GOAL TP=2 >= 1.7x TP=1 tok/s at batch 1: {x:.2f}x -> {'met' if x >= 1.7 else 'NOT met'}")
PYEOF
cat "$OUT/tp_goals.txt"

if [ "${SKIP_SERVING:-0}" != 1 ] && [ "$NGPU" -ge 2 ]; then
  OUT="$OUT" CONFIGS="tp1= tp2=--tensor-parallel-size%2" SUITE_S=${SUITE_S:-300} \
      bash scripts/gpu_serving_run.sh
fi
