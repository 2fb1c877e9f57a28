"""Issue 35, session 41: what-if — the power cap's ratios in device time, from the runs the default already reads.

Why: the default cap takes r (the pause check's 512-token step) and r_mix (the `sustained_mixed` step) as a
back-to-back trace's wall time over a paused run's wall time. Back to back the engine hides the host's launch; paused
it pays it. On the H100 6.7B bf16 (session 40's profile) the mixed step's paused wall is 15.45 ms against 14.01 on the
device, so r_mix reads 0.961 in wall time and 1.049 in device time, and with r_mix < 1 the mixed step weighs f_ref in
the busy share: the capped engine's most common step is charged no cap at all. Live, the steps with prefill rise
with load over the paused profile (1.000 -> 1.011, the board's power 560 -> 670 W: `prefill_by_clock.py`) where
the default's charge falls (1.0037 -> 1.0017). "Anchors in device time" (`cap_anchors="stream"`) took its ratios from
5-s streams instead (a flat ~2.7 % on this part). Here the same runs the default reads, in device time:
- "sustained": its trace's `trace_device_ms` over the paused step's device time (the `stream_kind` prefill run's
  `paused_device_ms_median`, the same 512-token shape, same pause);
- "sustained_mixed": `trace_device_ms` over `paused_device_ms_median`;
- "sustained_packed": over the `stream_kind` packed run's paused device time (the same 4 x 512 shape);
- "after_decode" (wall, paused after decode steps): less the paused step's launch (its wall - device).
Prints the steps with prefill, model / live, per run, for the default and this form, beside live / paused.

    python bench/results/pairs_s41/device_units_whatif.py PART_DIR [PART_DIR ...]
"""
import copy
import json
import sys
import tempfile
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from sims.profile_cost import ProfileCost

GAP_S = 1.0


def device_doc(doc: dict) -> tuple[dict, dict]:
    """The profile with its pause check's ratios in device time (module doc above), and what changed."""
    out = copy.deepcopy(doc)
    runs = out["pause_check"]["runs"]
    kind = {r.get("kind"): r for r in runs if r.get("run") == "stream_kind"}
    by = {r["run"]: r for r in runs if r.get("run") != "stream_kind"}
    note = {}
    pre = (kind.get("prefill") or {}).get("paused_device_ms_median")
    if pre and by.get("sustained", {}).get("trace_device_ms") and "paused" in by:
        wall = [by[k]["step_ms_median"] for k in ("paused", "paused_again") if k in by]
        launch = sum(wall) / len(wall) - pre
        for k in ("paused", "paused_again"):
            if k in by:
                by[k]["step_ms_median"] = pre
        if "after_decode" in by:
            by["after_decode"]["step_ms_median"] -= launch
        s = by["sustained"]
        s["trace_ms"] = s["trace_device_ms"]
        note["check"] = {"paused_wall": sum(wall) / len(wall), "paused_device": pre, "launch": launch}
    m = by.get("sustained_mixed")
    if m and m.get("trace_device_ms") and m.get("paused_device_ms_median"):
        note["mixed"] = {"paused_wall": m["paused_ms_median"], "paused_device": m["paused_device_ms_median"]}
        m["paused_ms_median"] = m["paused_device_ms_median"]
        m["trace_ms"] = m["trace_device_ms"]
    pk = by.get("sustained_packed")
    pk_dev = (kind.get("packed") or {}).get("paused_device_ms_median")
    if pk and pk.get("trace_device_ms") and pk_dev:
        note["packed"] = {"paused_wall": pk["paused_ms_median"], "paused_device": pk_dev}
        pk["paused_ms_median"] = pk_dev
        pk["trace_ms"] = pk["trace_device_ms"]
    return out, note


def main(argv: list[str]) -> None:
    for arg in argv:
        part = Path(arg)
        prof, doc, steps = fs.part_live_steps(part)
        terms = model_terms(doc, async_plan_lead(doc, "cuda"))
        dev, note = device_doc(doc)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(dev, f)
        costs = {"default": ProfileCost.from_json(prof, **terms),
                 "device": ProfileCost.from_json(f.name, **terms),
                 "paused": ProfileCost.from_json(prof, **{**terms, "power_cap": False, "cap_by_power": False})}
        Path(f.name).unlink()
        for name in ("default", "device"):
            c = costs[name]
            mix = c.cap_mixed or {}
            print(f"# {name}: cap (f_ref, r, r_dec) {tuple(round(x, 4) for x in c._cap) if c._cap else None}, "
                  f"r_mix {mix.get('r_mix', float('nan')):.4f}, w_mix {mix.get('w_mix', float('nan')):.4f}")
        print(f"# device-time inputs: {json.dumps(note)}")
        models = {n: {i: t for i, t, _f in fs.model_step_ms(c, steps)} for n, c in costs.items()}
        print(f"== {part}: steps with prefill (not after idle)")
        print(f"{'run':16s} {'n':>5s} {'live/paused':>11s} {'default/live':>12s} {'device/live':>11s} "
              f"{'dec-only default':>16s} {'dec-only device':>15s}")
        for label, idx in fs.labelled_runs(part, steps, GAP_S):
            sel = [i for i in idx if steps[i]["p"] and not steps[i].get("idle_before") and i in models["device"]]
            dec = [i for i in idx if not steps[i]["p"] and not steps[i].get("idle_before") and i in models["device"]]
            if not sel:
                continue
            live = sum(steps[i]["ms"] for i in sel)
            live_d = sum(steps[i]["ms"] for i in dec) or float("nan")
            print(f"{label:16s} {len(sel):5d} {live / sum(models['paused'][i] for i in sel):11.4f} "
                  f"{sum(models['default'][i] for i in sel) / live:12.4f} {sum(models['device'][i] for i in sel) / live:11.4f} "
                  f"{sum(models['default'][i] for i in dec) / live_d:16.4f} {sum(models['device'][i] for i in dec) / live_d:15.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
