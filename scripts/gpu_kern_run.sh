#!/usr/bin/env bash
# Issue 11's engine goals and issue 12's GPU half on one H200, in one device call:
#
#   HELD=path/to/heldout bash scripts/gpu_kern_run.sh     # results under $OUT (default out/gpu_kern)
#
# 1. `pytest -m gpu tests/test_kernels_gpu.py -k "$TESTS_K"` (PDL chains in graphs, fp16 / bf16
#    dots over quantized pages, the fp8 GEMVs, norms, rotary) under a TEST_S cap.
# 2. `python3 -m bench.engine.steps` on the 33B preset (dummy weights): batch 1 and 64 decode,
#    prefill 2048, bf16 and fp8, with per-kernel profiles (--kernel-profile) and the PDL on/off
#    A/B at batch 1 (--pdl-ab); BENCH_S deadline.
# 1b. (section sweep) `bench/kernels/fp8_gemv_sweep.py` for fp8 and bf16 weights over the one-row
#    kernel variants (row sums per tile, tensor-core fp16 dots, the silu-fused down projection);
#    each writes the fastest config per shape to $R/tuned_{fp8,bf16}.json, which the engine
#    section then runs with (`--gemv-configs`; --ab compares them with the committed tables).
# 3. `bench/kernels/gpu_check.py --sections dots,sdpa`: quantized-page decode attention with
#    fp16 vs bf16 dots and tile variants, against bf16 pages; SDPA GQA variants for a 2048 prompt.
# 3b. `bench/kernels/fp8_gemv_sweep.py`: the FMA GEMV over bf16 weights (our own bf16 GEMV) against
#    cuBLAS per 33B shape, and un-split thin tiles for the fp8 down projection; GEMV_S cap.
# 4. KV-format quality on tiny-coder through the CUDA kernel path (bf16 model): perplexity per
#    format and greedy agreement vs the bf16 cache. HELD holds stdlib/ and site/ copies of
#    models/tiny-coder/heldout_files.txt (the GPU machine's python lacks some of them).
#    PPL_ARGS: extra perplexity flags, e.g. "--max-num-batched-tokens 16" (one-block chunks:
#    each token's own block is the one being filled, as in a decode; issue 12's fill rows).
# Everything lands in $OUT/r and is packed into $OUT/results.tar.gz; the log is $OUT/log.txt.
set -u
OUT=${OUT:-out/gpu_kern}
TEST_S=${TEST_S:-60}
BENCH_S=${BENCH_S:-150}
KERN_S=${KERN_S:-70}
Q_S=${Q_S:-70}
GEMV_S=${GEMV_S:-40}
SWEEP_S=${SWEEP_S:-75}
SWEEP_BF16_S=${SWEEP_BF16_S:-35}
SECTIONS=${SECTIONS:-tests,engine,kernels,gemv,quality}
TESTS_K=${TESTS_K:-pdl or quantized_dot or dispatch_and_graph or fp8_gemv or rms_norm or silu or rotary}
ENGINE_ARGS=${ENGINE_ARGS:---decode-batches 1,64 --prefill-tokens 2048 --profile-contexts= --no-peer --kernel-profile --ab}
HELD=${HELD:-heldout}
R=${R:-$OUT/r}
mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
has() { case ",$SECTIONS," in *",$1,"*) return 0 ;; esac; return 1; }

{ nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem,power.draw --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} > "$R/env.txt" 2>&1
cat "$R/env.txt"

if has tests; then
  timeout -s INT "$TEST_S" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
      tests/test_kernels_gpu.py -k "$TESTS_K" > "$R/pytest_gpu.txt" 2>&1
  echo "pytest exit $?"
  grep -E "passed|failed|error|FAILED|ERROR" "$R/pytest_gpu.txt" | tail -n 12
fi

if has sweep; then
  # tiles: BN,BK,WARPS,R (R 0/1: row kernel, per-tile row sums off/on; 2: fp16 tensor-core dots;
  # 3: dots in the weights' dtype); the first tile of a shape is close to its committed config
  ROW7168="4,1024,1,1;8,512,1,1;8,1024,2,1;16,256,1,2;32,512,2,2;64,256,4,2"
  timeout -s INT "$SWEEP_S" python3 -m bench.kernels.fp8_gemv_sweep --out "$R" --weights fp8 \
      --shapes down_silu,qkv,o,gate_up,down --stages 3 --programs 1,4 --budget-s $((SWEEP_S - 15)) \
      --shape-tiles "down_silu=4,256,1,1;8,256,1,1;8,256,2,1;16,256,2,1;16,256,4,0" \
      --shape-tiles "qkv=2,1024,1,1;$ROW7168" --shape-tiles "o=4,512,1,1;$ROW7168" \
      --shape-tiles "gate_up=4,512,1,1;16,512,2,1;$ROW7168" \
      --shape-tiles "down=4,256,1,1;8,256,1,1;8,256,2,1;16,256,2,1;16,256,1,2;32,256,2,2;64,256,4,2" \
      --tuned-out "$R/tuned_fp8.json" > "$R/sweep_fp8_log.txt" 2>&1
  echo "fp8 sweep exit $?"; grep -E "copy|us |layer|took" "$R/sweep_fp8_log.txt" | tail -n 9
  timeout -s INT "$SWEEP_BF16_S" python3 -m bench.kernels.fp8_gemv_sweep --out "$R" --weights bf16 \
      --shapes down_silu,qkv,o,gate_up,down --stages 3 --programs 1,4 \
      --budget-s $((SWEEP_BF16_S - 10)) \
      --shape-tiles "down_silu=8,256,2,1;16,256,2,1;16,256,4,0" \
      --shape-tiles "qkv=16,256,4,1;8,512,2,1;16,512,2,1;64,256,4,3" \
      --shape-tiles "o=8,512,2,1;16,512,2,1;64,256,4,3" \
      --shape-tiles "gate_up=8,512,2,1;16,512,2,1;64,256,4,3" \
      --shape-tiles "down=8,256,2,1;16,256,2,1;64,256,4,3" \
      --tuned-out "$R/tuned_bf16.json" > "$R/sweep_bf16_log.txt" 2>&1
  echo "bf16 sweep exit $?"; grep -E "copy|us |layer|took" "$R/sweep_bf16_log.txt" | tail -n 9
  TUNED=$(ls "$R"/tuned_fp8.json "$R"/tuned_bf16.json 2>/dev/null | paste -sd, -)
  [ -n "$TUNED" ] && ENGINE_ARGS="$ENGINE_ARGS --gemv-configs $TUNED"
fi

if has engine; then
  eval "timeout -s INT $((BENCH_S + 25)) python3 -m bench.engine.steps --deadline-s $BENCH_S \
      --out $R/engine_bench.json $ENGINE_ARGS" > "$R/engine_log.txt" 2>&1
  echo "engine bench exit $?"
  grep -E "kernel profile|^\[.*\]     |a/b|decode|prefill|ERROR|SKIP|MET" "$R/engine_log.txt" | tail -n 90
fi

if has kernels; then
  timeout -s INT "$KERN_S" python3 -m bench.kernels.gpu_check --skip-tests --sections dots,sdpa \
      --out "$R" > "$R/kernels_log.txt" 2>&1
  echo "kernels check exit $?"
  grep -E "^dots|^sdpa|ceilings" "$R/kernels_log.txt" | tail -n 60
fi

if has gemv; then
  timeout -s INT "$GEMV_S" python3 -m bench.kernels.fp8_gemv_sweep --out "$R" --weights bf16 \
      --tiles "2,1024,1;4,512,1;8,512,2;16,256,4" --stages 2,3 --programs 1 --budget-s 20 \
      > "$R/gemv_bf16_log.txt" 2>&1
  echo "gemv bf16 sweep exit $?"; grep -E "bf16|copy" "$R/gemv_bf16_log.txt" | tail -n 8
  [ -n "${GEMV_DOWN:-}" ] && timeout -s INT 20 python3 -m bench.kernels.fp8_gemv_sweep --out "$R" --weights fp8 --shapes down \
      --tiles "4,256,1;2,256,1;8,256,2" --stages 2,3 --programs 1,4 --budget-s 12 \
      > "$R/gemv_fp8_down_log.txt" 2>&1
  echo "gemv fp8 down sweep exit $?"; grep -E "down|copy" "$R/gemv_fp8_down_log.txt" | tail -n 4
fi

if has quality; then
  # each run: kind:format[:ENV=VALUE] (kind ppl = perplexity, agree = greedy agreement vs auto)
  RUNS=${QUALITY_RUNS:-ppl:auto ppl:fp8 ppl:int4-fp8 agree:fp8 agree:int4-fp8}
  t0=$(date +%s)
  common="--model models/tiny-coder --device cuda --stdlib-root $HELD/stdlib --site-root $HELD/site --quiet"
  for run in $RUNS; do
    [ $(( $(date +%s) - t0 )) -lt "$Q_S" ] || { echo "quality: out of time before $run"; break; }
    IFS=: read -r kind fmt envset <<< "$run"
    tag="${kind}_${fmt}${envset:+_${envset//[^A-Za-z0-9]/_}}"
    if [ "$kind" = ppl ]; then
      env $envset python3 -m evals.cli perplexity $common --kv-cache-dtype "$fmt" \
          --sample-windows 32 ${PPL_ARGS:-} --json "$R/$tag.json" > "$R/$tag.txt" 2>&1
    else
      env $envset python3 -m evals.cli agreement $common --a kv-cache-dtype=auto \
          --b "kv-cache-dtype=$fmt" --num-prompts 32 --max-tokens 32 --json "$R/$tag.json" \
          > "$R/$tag.txt" 2>&1
    fi
    echo "$tag exit $?: $(tail -n 2 "$R/$tag.txt" | tr '\n' ' ' | cut -c1-220)"
  done
fi

tar czf "$OUT/results.tar.gz" -C "$R" .
echo "packed $(du -h "$OUT/results.tar.gz" | cut -f1)"
