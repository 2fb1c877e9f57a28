"""Issue 35, session 40: what-if — the live steps with prefill as the model without decode spells (nospell) times
the profile's spin level, per run, against live and the default form.

Why: a busy engine's steps with prefill run a level over the paused profile that the decode spells' flat charge
stands in for (README section 1). The pause check's sustained_mixed run times its step twice on the device:
after the grid's 60 ms pause (`paused_device_ms_median`) and with no pause, only the 5 ms spin that queues it
(`spin_device_ms_median`). Their ratio r_spin is 1.041-1.048 on the H100 33B bf16 profiles, 1.027 on the int4-fp8
KV one, 1.002 on the 33B FP8, 1.000-1.002 on the 6.7B ones: the live levels' order. Here a step with prefill that
does not follow an idle spell is charged (r_spin - 1) more, scaled by its compute share against the
sustained_mixed step's ("scaled"), or not ("flat"). Then the form as built (`decode_spells="spin"`: "spin", which
must read as "+flat"), the stream anchors alone ("stream") and with the busy level ("str_spin").

    python bench/results/pairs_s40/spin_level_whatif.py PART_DIR [PART_DIR ...]
"""
import sys
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from sims.profile_cost import ProfileCost
from sims.profile_terms import has_sustained_mixed

GAP_S = 1.0


def spin_ratio(doc: dict) -> tuple[float, tuple[int, int, int]]:
    r = next(r for r in doc["pause_check"]["runs"] if r["run"] == "sustained_mixed")
    return (r["spin_device_ms_median"] / r["paused_device_ms_median"],
            (r["num_decode_seqs"], r["num_prefill_tokens"], r["decode_context_len"]))


def main(argv: list[str]) -> None:
    for arg in argv:
        part = Path(arg)
        prof, doc, steps = fs.part_live_steps(part)
        base = {k: v for k, v in model_terms(doc, async_plan_lead(doc, "cuda")).items() if k != "cap_by_power"}
        capped = base.get("power_cap") and has_sustained_mixed(doc)
        forms = {"default": {**base, **({"cap_by_power": True} if capped else {})},
                 "nospell": {**base, **({"cap_by_power": True, "decode_spells": False} if capped else {})},
                 # the form as built (sims.profile_cost, "The busy level"), and with the stream anchors
                 "spin": {**base, **({"cap_by_power": True} if capped else {}), "decode_spells": "spin"},
                 "stream_spin": {**base, **({"cap_by_power": True} if capped else {}), "decode_spells": "spin",
                                 "cap_anchors": "stream"},
                 "stream": {**base, **({"cap_by_power": True} if capped else {}), "cap_anchors": "stream"},
                 "paused": {**base, "power_cap": False}}
        costs = {n: ProfileCost.from_json(prof, **t) for n, t in forms.items()}
        models = {n: {i: t for i, t, _f in fs.model_step_ms(c, steps)} for n, c in costs.items()}
        r_spin, (dm, pm, cm) = spin_ratio(doc)
        ns = costs["nospell"]
        ref_share = ns.compute_share(dm, pm, dm * cm) if ns.caps_by_compute else None
        print(f"== {part}: r_spin {r_spin:.4f}; steps with prefill, model / live")
        print(f"{'run':16s} {'n':>5s} {'default':>8s} {'nospell':>8s} {'+flat':>8s} {'+scaled':>8s} {'spin':>8s} "
              f"{'stream':>8s} {'str_spin':>8s}")
        for label, idx in fs.labelled_runs(part, steps, GAP_S):
            sel = [i for i in idx if steps[i]["p"] and i in models["nospell"]]
            if not sel:
                continue
            live = sum(steps[i]["ms"] for i in sel)
            flat = scaled = 0.0
            for i in sel:
                s, t = steps[i], models["nospell"][i]
                if s.get("idle_before"):
                    flat += t
                    scaled += t
                    continue
                flat += t * r_spin
                if ref_share:
                    ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
                    sh = ns.compute_share(s["d"], s["p"], ctx, s["chunks"] or None)
                    scaled += t * (1.0 + (r_spin - 1.0) * sh / ref_share)
                else:
                    scaled += t * r_spin
            print(f"{label:16s} {len(sel):5d} {sum(models['default'][i] for i in sel) / live:8.4f} "
                  f"{sum(models['nospell'][i] for i in sel) / live:8.4f} {flat / live:8.4f} {scaled / live:8.4f} "
                  + " ".join(f"{sum(models[n][i] for i in sel) / live:8.4f}" for n in ("spin", "stream", "stream_spin")))


if __name__ == "__main__":
    main(sys.argv[1:])
