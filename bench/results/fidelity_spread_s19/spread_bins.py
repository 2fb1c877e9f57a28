"""Issue 35, session 19: a grid part's decode-only steps binned by their contexts' spread (max / mean),
the cost model's time against live in each bin, without and with the unequal-contexts term
(sims.decode_spread) at given kappas. The model is built as validate_replay builds it (the part's
own profile and recorded terms, `--cap-by-power` when the profile has the runs: as the grid state's
default), the steps rebuilt from the step log (`bench.simulator.fidelity_steps.live_steps`).

    python spread_bins.py PART_DIR [KAPPA ...]      (KAPPA: a what-if; "measured": the profile's own)
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import live_steps, model_step_ms, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost

D_BINS = ((2, 8), (9, 16), (17, 32), (33, 64), (65, 256))


def build(part: Path, spread):
    tag = part.name
    val = json.loads((part / f"validate_{tag}.json").read_text())
    terms = dict(val["profile"]["model_terms"])
    doc = json.loads((part / f"profile_{tag}.json").read_text())
    runs = {r.get("run") for r in (doc.get("pause_check") or {}).get("runs", [])}
    if terms.get("power_cap") and "sustained_mixed" in runs:
        terms["cap_by_power"] = True
    return ProfileCost.from_json(part / f"profile_{tag}.json", **terms, decode_spread=spread), terms


def main(argv):
    part = Path(argv[0])
    kappas = argv[1:] or ["2.5"]
    tag = part.name
    arr, _ = read_log(part / f"decisions_{tag}.jsonl.gz")
    steps, bad = live_steps(read_steps(part / f"steps_{tag}.jsonl.gz"), {a.request_id: a.max_tokens for a in arr})
    print(f"== {tag}: {len(steps)} steps, rebuild mismatches {bad}")
    cols = ["off"] + kappas
    res = {}
    for k in cols:
        cost, terms = build(part, "off" if k == "off" else ("measured" if k == "measured" else float(k)))
        if k == "measured":
            print(f"   measured kappa {cost.spread_kappa}; per point: "
                  + ", ".join(f"d {p['num_decode_seqs']}: {p['kappa']:.2f}" for p in cost.spread_point_kappas))
        res[k] = {i: t for i, t, _f in model_step_ms(cost, steps)}
    print(f"   terms {terms}; cells: model / live of the bin's total time")
    dec = [i for i, s in enumerate(steps) if not s["p"] and s["d"] >= 2 and i in res["off"]]

    def spread(s):
        return max(s["ctxs"]) / (sum(s["ctxs"]) / len(s["ctxs"]))

    print(f"\n  {'d':>8s} {'max/mean':>9s} {'n':>6s} {'live ms':>8s} " + " ".join(f"{'k ' + k:>9s}" for k in cols))
    for lo, hi in D_BINS:
        for r0 in (1.0, 1.5, 2.0, 2.5, 3.0, 3.5):
            sel = [i for i in dec if lo <= steps[i]["d"] <= hi and r0 <= spread(steps[i]) < r0 + 0.5 - 1e-9 * (r0 < 3.5) + 99 * (r0 == 3.5)]
            if len(sel) < 20:
                continue
            live = sum(steps[i]["ms"] for i in sel)
            print(f"  {lo:3d}-{hi:<4d} {r0:4.1f}{'+' if r0 == 3.5 else '-' + format(r0 + 0.5, '.1f'):5s} {len(sel):6d} {live / len(sel):8.3f} "
                  + " ".join(f"{sum(res[k][i] for i in sel) / live:9.4f}" for k in cols))
    for name, sel in (("decode-only, all", [i for i, s in enumerate(steps) if not s["p"] and i in res["off"]]),
                      ("with prefill", [i for i, s in enumerate(steps) if s["p"] and i in res["off"]]),
                      ("all steps", [i for i in res["off"]])):
        live = sum(steps[i]["ms"] for i in sel)
        print(f"  {name:24s} {len(sel):6d} {live / len(sel):8.3f} " + " ".join(f"{sum(res[k][i] for i in sel) / live:9.4f}" for k in cols))


if __name__ == "__main__":
    main(sys.argv[1:])
