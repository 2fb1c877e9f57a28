#!/usr/bin/env bash
# Issue 35, session 27: live steps' compositions replayed on the device (`bench.engine.replay_live`),
# pipelined as the serving loop runs them and paused as the profile times its points, beside the live
# device times and the cost model's (bench/results/fidelity_onset_s27/live_replay_read.py). ~1-2 min.
# Prepare the compositions on the CPU first (an untracked file travels with the tree):
#   python bench/results/fidelity_onset_s27/live_replay_prep.py bench/results/fidelity_grid_h100_s21/6.7b-mixed-seeds \
#       bench/results/fidelity_onset_s27/compositions_h100_6.7b-mixed.json 300 0.3
#   run(kind="nvidia-h100-x1", carry=[".whl"], timeout_s=300, command="OUT0=$OUT; mkdir -p /tmp/R; (OUT=/tmp/R COMP=bench/results/fidelity_onset_s27/compositions_h100_6.7b-mixed.json timeout -s INT 270 bash scripts/gpu_live_replay_run.sh > /tmp/R/log.txt 2>&1); tar czf $OUT0/R.tar.gz -C /tmp R; tail -12 /tmp/R/log.txt")
set -uo pipefail
: "${OUT:?set OUT}" "${COMP:?set COMP (the compositions JSON)}"
MODEL=${MODEL:-deepseek-coder-6.7b}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu MODEL=tiny: a dry run of the commands
source "$(dirname "$0")/gpu_common.sh"  # the repo root, $PY, the carried wheels, $OUT
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?')" | tee -a "$OUT/gpu.txt"
cp "$COMP" "$OUT/compositions.json"
t0=$(date +%s)
$PY -m bench.engine.replay_live --model "$MODEL" --device "$DEVICE" --steps "$COMP" --out "$OUT/replay.json" \
  ${PASSES:+--passes $PASSES} 2>&1 | tail -5
echo "replay: $(( $(date +%s) - t0 )) s"
[ -f bench/results/fidelity_onset_s27/live_replay_read.py ] && \
  $PY bench/results/fidelity_onset_s27/live_replay_read.py "$COMP" "$OUT/replay.json" | tee "$OUT/read.txt"
