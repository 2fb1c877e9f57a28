#!/usr/bin/env bash
# Issue 33 on a 2-GPU machine (nvidia-h200-x2): tensor parallelism over two "hosts" (network
# namespaces, NCCL and gloo over their veth link) against the same two ranks on one host, and the
# failover across namespaces, each as its pytest test; logs and a summary JSON under $OUT.
#   bash scripts/gpu_multihost_run.sh            (needs root for the namespaces, 2 GPUs)
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
NGPU=$(grep -c '^GPU' "$OUT/gpus.txt" || true)
echo "GPUs: $NGPU" | tee "$OUT/summary.txt"
rc_tp=skipped
if [ "${NGPU:-0}" -ge 2 ]; then
  TIDEGATE_NETNS_TP_DEVICE=cuda NCCL_DEBUG=INFO timeout 900 "$PY" -m pytest -q -s -p no:cacheprovider \
      tests/test_netns_tensor_parallel.py > "$OUT/netns_tp_cuda.log" 2>&1
  rc_tp=$?
fi
timeout 600 "$PY" -m pytest -q -s -p no:cacheprovider tests/test_netns_failover.py \
    > "$OUT/netns_failover.log" 2>&1
rc_fo=$?
grep -h "NCCL INFO.*Channel\|NCCL INFO.*via" "$OUT/netns_tp_cuda.log" 2>/dev/null | head -20 \
    > "$OUT/nccl_transports.txt"
printf '{"netns_tp_cuda_rc": "%s", "netns_failover_rc": "%s"}\n' "$rc_tp" "$rc_fo" \
    | tee "$OUT/summary.json"
