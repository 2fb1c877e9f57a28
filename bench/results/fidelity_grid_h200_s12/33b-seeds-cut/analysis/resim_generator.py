"""Issue 35, the cut 33b-seeds call: re-simulate its four runs on the generator's arrivals (the
comparison its log printed; the validate JSON was cut) with the call's own profile, under three
power-cap models, against the live figures its log recorded. CPU only, seconds.

    .venv/bin/python bench/results/fidelity_grid_h200_s12/33b-seeds-cut/analysis/resim_generator.py
"""
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]
sys.path.insert(0, str(ROOT))

from bench.simulator.fidelity_stats import METRICS, pick
from bench.simulator.live_config import live_prefill_cap
from bench.simulator.validate import async_plan_lead, sim_spec
from gateway.serve import build_parser, gateway_config
from sims.event_loop import simulate
from sims.profile_cost import ProfileCost
from sims.report import summarize
from sims.workload import generate

PROFILE = HERE.parent / "33b-seeds" / "profile_33b-seeds.json"
LOG = HERE.parent / "33b-seeds" / "validate_33b-seeds.log"
doc = json.loads(PROFILE.read_text())
gw = gateway_config(build_parser().parse_args(["--port", "0", "--model", "deepseek-coder-33b",
                                               "--device", "cuda"]), ["live"])
lead = async_plan_lead(doc, "cuda")
cap = live_prefill_cap("cuda", [])
MODELS = {"no power cap": {"power_cap": False},
          "cap by prefill share (before e038184)": {"power_cap": True, "cap_by_compute": False},
          "cap by compute share (e038184, default)": {"power_cap": True,
                                                      "cap_by_compute": True}}
runs = []
for line in LOG.read_text().splitlines():
    m = re.search(r"load ([\d.]+)x rate ([\d.]+) seed (\d+): (.*?)  \[", line)
    if m:
        live = {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+)/[\d.]+", m.group(4))}
        runs.append((m.group(1), float(m.group(2)), int(m.group(3)), live))
out = []
print(f"{'load':5s} {'seed':4s} {'model':42s} {'TTFT p50':>16s} {'TPOT p50':>16s} {'ITL p50':>16s}")
for load, rate, seed, live in runs:
    for name, kw in MODELS.items():
        spec = sim_spec(PROFILE, 17069, 16, 16384, int(doc["max_num_seqs"]),
                        int(doc["max_num_batched_tokens"]), gw.batcher, gw.queues, 200, rate,
                        512, 128, seed, 1.0, lead, cap, None)
        cost = ProfileCost.from_json(str(PROFILE), hide_launch=True, **kw)
        sim = summarize(simulate(generate(spec.workload), cost, spec.scheduler, spec.engine))
        row = {"load": load, "seed": seed, "model": name}
        cells = []
        metrics = {m[0]: m for m in METRICS}
        for k in ("ttft_p50", "tpot_p50", "itl_p50"):
            _, key, stat = metrics[k]
            v = pick(sim, key, stat)
            err = (v - live[k]) / live[k] * 100
            row[k] = {"live": live[k], "sim": v, "err_pct": err}
            cells.append(f"{v:7.2f} ({err:+5.1f}%)")
        out.append(row)
        print(f"{load:5s} {seed:<4d} {name:42s} " + " ".join(f"{c:>16s}" for c in cells))
(HERE / "resim_generator.json").write_text(json.dumps(out, indent=1) + "\n")
