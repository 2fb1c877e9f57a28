"""Issue 35, session 39: a part's live steps against the cost model at HEAD, per run (load, seed), with and
without the power cap by step kind. Runs are cut at idle gaps over GAP_S, in the validate log's order.

Why: the 33B cells on the current profiler read TTFT P50 +1 to +3 % at 0.5x in the default form and -2 % without
the cap term; this says which steps the term charges there, per load.

    python bench/results/pairs_s39/steps_by_run.py PART_DIR
"""
import json
import re
import sys
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost
from sims.profile_terms import has_sustained_mixed

GAP_S = 1.0  # the validate's runs are 2-4 s apart (scoring, the next run's start); inside a run the engine idles < 1 s


def main(argv: list[str]) -> None:
    part = Path(argv[0])
    tag = part.name
    prof = part / f"profile_{tag}.json"
    doc = json.loads(prof.read_text())
    base = model_terms(doc, async_plan_lead(doc, "cuda"))
    forms = {"default": {**base, **({"cap_by_power": True} if base.get("power_cap") and has_sustained_mixed(doc) else {})},
             "nocap": {k: v for k, v in base.items() if k != "cap_by_power"}}
    arr, _ = read_log(part / f"decisions_{tag}.jsonl.gz")
    steps, _bad = fs.live_steps(fs.read_steps(part / f"steps_{tag}.jsonl.gz"), {a.request_id: a.max_tokens for a in arr})
    models = {}
    for name, terms in forms.items():
        cost = ProfileCost.from_json(prof, **terms)
        models[name] = {i: t for i, t, _f in fs.model_step_ms(cost, steps)}
    labels = [f"{m.group(1)} seed {m.group(2)}" for m in
              re.finditer(r"load (\S+) rate \S+ seed (\d+)", (part / f"validate_{tag}.log").read_text())]
    runs, cur = [], []
    for i, s in enumerate(steps):
        if cur and s["start"] - steps[cur[-1]]["end"] > GAP_S:
            runs.append(cur)
            cur = []
        cur.append(i)
    if cur:
        runs.append(cur)
    print(f"== {tag}: {len(runs)} runs cut at {GAP_S:g} s gaps, {len(labels)} in the log; model / live of the totals")
    print(f"{'run':16s} {'decode n':>8s} {'default':>8s} {'nocap':>8s} {'prefill n':>9s} {'default':>8s} {'nocap':>8s}")
    for k, idx in enumerate(runs):
        label = labels[k] if k < len(labels) and len(runs) == len(labels) else f"run {k}"
        row = [f"{label:16s}"]
        for kind in ("decode", "prefill"):
            sel = [i for i in idx if i in models["default"] and (steps[i]["p"] > 0) == (kind == "prefill")
                   and (steps[i]["d"] or steps[i]["p"])]
            live = sum(steps[i]["ms"] for i in sel)
            row.append(f"{len(sel):8d}" if kind == "decode" else f"{len(sel):9d}")
            for name in ("default", "nocap"):
                row.append(f"{sum(models[name][i] for i in sel) / live:8.4f}" if live else f"{'-':>8s}")
        print(" ".join(row))


if __name__ == "__main__":
    main(sys.argv[1:])
