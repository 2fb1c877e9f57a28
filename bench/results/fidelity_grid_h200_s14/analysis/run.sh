#!/usr/bin/env bash
# Issue 35, session 14: the fidelity table and its diagnostics for one grid part, re-computed on the
# CPU from the part's committed files (../PART/: validate JSON, decision and step logs, profile).
# Run from this folder: bash run.sh [PART] (default 6.7b; ~1-2 min on 2 cores). Writes PART_*.
#   1. table_PART.md: sim validate's own comparison (replay + delivery path; and its independent
#      simulation) as BENCHMARKS' fidelity table (bench.simulator.fidelity_table), every load's
#      figures with their 95% interval, the mean window size and the prefill steps alike;
#   2. replay_PART*.json/txt: the same comparison re-run with today's simulator
#      (bench.simulator.validate_replay): with the session's k (must reproduce 1.), with the path
#      as the lowest load's constant (what the per-stream path is worth), and on the s13 6.7B logs
#      with this part's measured profile (profile or session?);
#   3. steps_PART_{asrun,live_times}.json/txt: the cost model at every live step by kind, the
#      schedules' first partings, and the replay with the live step times fed back (diagnostic);
#   4. ttft_parts_PART.txt: where TTFT goes, live against the re-simulations.
set -euo pipefail
cd "$(dirname "$0")"
P=${1:-6.7b}
ROOT=${ROOT:-$(cd ../../../.. && pwd)}
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
S13=${S13:-../../fidelity_grid_h200_s13}
R=../$P; V=$R/validate_$P.json; D=$R/decisions_$P.jsonl.gz; S=$R/steps_$P.jsonl.gz; PR=$R/profile_$P.json
# the validate's model terms: async lead, delivery base and per-stream k, hide launch, power cap
read -r LEAD BASE K FLAGS < <($PY - "$V" <<'PYEOF'
import json, sys
v = json.load(open(sys.argv[1]))
t = v["profile"]["model_terms"]; dp = v.get("delivery_path") or {}
flags = " ".join(f for f, on in (("--hide-launch", t.get("hide_launch")), ("--power-cap", t.get("power_cap"))) if on)
print(v["profile"]["async_plan_lead_ms"], dp.get("base_ms", v.get("delivery_delay_ms")), dp.get("per_stream_ms", 0.0), flags)
PYEOF
)
echo "$P: lead $LEAD ms, delivery $BASE ms + $K ms/stream, $FLAGS"
# 1. the table
{ echo "## $P: sim validate's replay + delivery path (the fidelity table)"; echo
  $PY -m bench.simulator.fidelity_table "$V"
  echo; echo "## $P: sim validate's independent simulation (the generator's schedule)"; echo
  $PY -m bench.simulator.fidelity_table --which run "$V"; } > table_$P.md
# 2. the replay again with today's simulator
$PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile "$V" "$D" "$S" --profile "$PR" --delivery-per-stream-ms recorded \
  --json replay_$P.json > replay_$P.txt
$PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile "$V" "$D" "$S" --profile "$PR" --delivery-per-stream-ms off \
  --json replay_${P}_constant_path.json > replay_${P}_constant_path.txt
$PY - "$V" replay_$P.json >> replay_$P.txt <<'PYEOF'
import json, sys
v, r = (json.load(open(x)) for x in sys.argv[1:3])
worst = 0.0
for lv, lr in zip(v["loads"], r["loads"], strict=True):
    for a, b in zip(lv["runs"], lr["runs"], strict=True):
        for m, c in a["compare_replay_path"].items():
            s0, s1 = c["sim"], b["compare_replay_path"][m]["sim"]
            if s0 == s0 and s0:
                worst = max(worst, abs(s1 / s0 - 1))
print(f"reproduction: largest relative difference of a simulated figure from the validate's own: {worst:.2e}")
PYEOF
if [ "$P" = 6.7b ] && [ -s "$S13/6.7b/validate_6.7b.json" ]; then
  # the s13 6.7B logs with this session's measured profile (the what-if's measured counterpart)
  $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $S13/6.7b/validate_6.7b.json $S13/6.7b/decisions_6.7b.jsonl.gz \
    $S13/6.7b/steps_6.7b.jsonl.gz --profile "$PR" --json replay_s13_6.7b_with_s14_profile.json \
    > replay_s13_6.7b_with_s14_profile.txt
  # and the prediction this part tests: s13 logs, the what-if profile, k fitted (held-out seeds 2-4)
  $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile $S13/6.7b/validate_6.7b.json $S13/6.7b/decisions_6.7b.jsonl.gz \
    $S13/6.7b/steps_6.7b.jsonl.gz --profile $S13/analysis/profile_6.7b_surrogate_db.json --seeds 2,3,4 \
    --json replay_s13_6.7b_whatif.json > replay_s13_6.7b_whatif.txt
fi
# 3. steps: the cost model at the live steps, the schedules' partings; live step times (diagnostic)
steps() {  # out [extra]
  local O=$1; shift
  $PY -m bench.simulator.fidelity_steps "$V" "$D" "$S" "$PR" --async-plan-lead-ms $LEAD --delivery-ms $BASE \
    --delivery-per-stream-ms $K $FLAGS --prefill-launch-deadline --network-delay-ms auto "$@" --json $O.json > $O.txt
}
steps steps_${P}_asrun &
steps steps_${P}_live_times --live-times &
wait
# 4. where TTFT goes (the constant path in the re-simulations; live out beside it)
$PY $S13/analysis/ttft_parts.py $R $P $LEAD $BASE > ttft_parts_$P.txt || echo "ttft_parts failed" >&2
echo "done: table_$P.md replay_$P*.txt steps_${P}_*.txt ttft_parts_$P.txt"
# 5. what-if (6.7B): the power cap the pause check did not see, r from train seeds 0-1, scored on 2-4
if [ "$P" = 6.7b ]; then
  $PY whatif_sustained_cap.py $R 0,1 profile_6.7b_sustained_whatif.json > whatif_sustained_cap.txt
  $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile "$V" "$D" "$S" --profile profile_6.7b_sustained_whatif.json --seeds 2,3,4 \
    --json replay_6.7b_sustained_whatif.json > replay_6.7b_sustained_whatif.txt
  $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile "$V" "$D" "$S" --profile "$PR" --seeds 2,3,4 \
    --json replay_6.7b_heldout.json > replay_6.7b_heldout.txt
fi
# 6. what-if (6.7B): the window fires late (live 5.62 ms at the lowest load vs the batcher's 5.00):
#    that lateness added to every request's dispatch, as run and with the sustained-cap what-if
if [ "$P" = 6.7b ]; then
  LATE=$($PY -c "import json,statistics as s; v=json.load(open('$V')); print(s.mean(r['ttft_path_ms']['window'] for r in v['loads'][0]['runs']) - v['config']['batcher']['min_latency_ms'])")
  $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile "$V" "$D" "$S" --profile "$PR" --extra-dispatch-ms $LATE \
    --json replay_6.7b_window_late.json > replay_6.7b_window_late.txt
  $PY -m bench.simulator.validate_replay --gateway-loop off --plan-lead profile "$V" "$D" "$S" --profile profile_6.7b_sustained_whatif.json --seeds 2,3,4 \
    --extra-dispatch-ms $LATE --json replay_6.7b_sustained_whatif_window_late.json > replay_6.7b_sustained_whatif_window_late.txt
fi
