#!/usr/bin/env bash
# Issue 32, third H200 call: the 1.3B batch-1 step after the swept GEMV configs (1.223 ms a
# token, served ITL p50 1.16 ms; scripts/gpu_host_cost_tune_run.sh). Its kernel profile: the
# GEMV chain 0.60 ms (the weights' floor 0.56), the rest in 159 small kernels: 48 norms (chain
# 0.097 ms), 24 split-k reduces after the silu-fused down projection's 3-way split (0.145), 24
# attention merges (0.123). Tried here:
#   1. our GEMV with the RMSNorm folded in (qkv_norm, gate_up_norm) swept over the 1.3B shapes
#                                                        -> $OUT/sweep_norm.txt, tuned_norm.json
#   2. batch-1 decode A/B, norms separate vs folded in (TIDEGATE_FUSED_NORM_GEMV), with the
#      swept configs (A) and with the silu-fused down projection held to one split (B: no
#      reduce launch)                                    -> $OUT/steps_A.txt, steps_B.txt
#   3. served 16/32 at 2 req/s with the norms folded in, A's and B's configs
#                                                        -> $OUT/serving_A.tar.gz, serving_B.tar.gz
#   OUT=$OUT bash scripts/gpu_host_cost_tune2_run.sh     # ~200 s on the H200; needs
#   bench/results/host_cost_h200_s12/tune/tuned_1.3b.json (the first sweep's configs)
#   DEVICE=cpu bash scripts/gpu_host_cost_tune2_run.sh   # CPU check: step 3's plumbing, tiny
set -u
OUT=${OUT:-out/gpu_host_cost_tune2}
MODEL=${MODEL:-deepseek-coder-1.3b}
DEVICE=${DEVICE:-cuda}
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
T1=bench/results/host_cost_h200_s12/tune/tuned_1.3b.json
TN=$OUT/tuned_norm.json
S1=$OUT/down_split1.json
# the first sweep's best down-with-silu tile at one program per SM: 256 tiles of 8 rows fill
# the 132 SMs without a K split (split_k_for), so no reduce launch follows it
cat > "$S1" <<'JSON'
{"silu_down_bf16": {"2048x5504": {"block_n": 8, "block_k": 512, "num_warps": 2, "num_stages": 2,
  "programs_per_sm": 1, "use_dot": false, "prefetch": false, "row_sum_each": false, "dot_f16": false}}}
JSON
if [ "$DEVICE" != cpu ]; then
  timeout -s INT 90 $PY -m bench.kernels.fp8_gemv_sweep --preset "$MODEL" --weights bf16 \
      --shapes qkv_norm,gate_up_norm --budget-s 60 --out "$OUT/sweep_norm" --tuned-out "$TN" \
      > "$OUT/sweep_norm.txt" 2>&1
  echo "sweep exit $?"; grep -v "^ " "$OUT/sweep_norm.txt" | tail -n 4
  for v in A B; do
    CFG=$T1,$TN; [ $v = B ] && CFG=$T1,$TN,$S1
    timeout -s INT 80 $PY -m bench.engine.steps --preset "$MODEL" --gemv-configs "$CFG" --ab \
        --ab-fused-norm --kernel-profile --decode-batches 1 --prefill-tokens 512 --no-fp8 \
        --no-peer --deadline-s 60 --out "$OUT/steps_$v.json" > "$OUT/steps_$v.txt" 2>&1
    echo "steps $v exit $?"; grep -E "a/b|^bf16 +1 |    [a-z].* ms .* launches" "$OUT/steps_$v.txt" | head -14
  done
else
  MODEL=tiny; echo '{}' > "$TN"; T1=$TN
fi
WL=issue32; [ "$DEVICE" = cpu ] && WL=tiny
export TIDEGATE_FUSED_NORM_GEMV=1
for v in A B; do
  CFG=$T1,$TN; [ $v = B ] && CFG=$T1,$TN,$S1
  # the server reads one file: merge them (later files win)
  $PY -c 'import json,sys; d={}
for p in sys.argv[2:]:
    for t, e in json.load(open(p)).items(): d.setdefault(t, {}).update(e)
json.dump(d, open(sys.argv[1], "w"), indent=1)' "$OUT/serve_$v.json" ${CFG//,/ }
  export TIDEGATE_GEMV_CONFIGS=$OUT/serve_$v.json
  timeout -s INT 90 $PY -m bench.serving.suite --out "$OUT/serving_$v" --workloads "$WL" \
      --only short_2rps --deadline-s 75 --config "bf16=" -- --model "$MODEL" --load-format dummy \
      --device "$DEVICE"
  echo "serving $v exit $?"
  tar czf "$OUT/serving_$v.tar.gz" -C "$OUT" "serving_$v" && rm -rf "$OUT/serving_$v"
done
echo "total $(( $(date +%s) - T0 )) s"
