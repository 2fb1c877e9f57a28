#!/usr/bin/env bash
# Issue 31, ninth session: every decision the forced replay with the live placement ("read"
# setting of fid_eval.py: distinct prompts, the run's own step end -> read delay) still takes
# otherwise than live, per run: class, live and replay prediction + margin, and (tot) how far
# each side's prediction + margin was from the deadline (ms; > 0: refused).
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../.." || exit 1
for r in "$HERE"/paced_w* "$HERE"/cw_w*; do
  name=$(basename "$r")
  rate=$(awk '{print $(NF-1)}' "$r/rate.txt")
  case $rate in 15.9) gw=500;; 31.9) gw=560;; *) gw=870;; esac
  rd=$(.venv/bin/python -c "import json; j=json.load(open('$r/lag_parts.json')); print(round(j['outputs O-E'][2]+j['wire+gateway G-O'][2],2))")
  extra=(); case $name in cw_*) extra=(--compete-window);; esac
  .venv/bin/python "$HERE/fid_join.py" "$r" --slo-ttft-ms fast=750,normal=1000,slow=1600 \
    --target-throughput 1 --min-latency-ms 600 --no-idle-flush --step-ms 20 --gateway-message-us $gw \
    --network-delay-ms 0.5 --distinct-prompts --gateway-read-delay-ms "$rd" "${extra[@]}" \
    --json /tmp/differing_$name.json > /dev/null
  echo "== $name (rate $rate, read delay $rd ms)"
  .venv/bin/python - "$name" <<'PY'
import json, sys
d = json.load(open(f"/tmp/differing_{sys.argv[1]}.json"))
dl = {"fast": 750, "normal": 1000, "slow": 1600}
for x in d["differing_forced_placed"]:
    lt = x["live_pred_ms"] + x["live_margin_ms"] - dl[x["class"]]
    st = x["sim_pred_ms"] + x["sim_margin_ms"] - dl[x["class"]]
    print(f"{x['t']:8.3f} {x['class']:6s} live {x['live'][0].upper()} pred {x['live_pred_ms']:7.1f} "
          f"margin {x['live_margin_ms']:7.1f} (tot {lt:+7.1f}) | replay pred {x['sim_pred_ms']:7.1f} "
          f"margin {x['sim_margin_ms']:7.1f} (tot {st:+7.1f})")
PY
done
