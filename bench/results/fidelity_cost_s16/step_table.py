"""Issue 35, session 16 (H35F): the cost model at every live step (model / live of the totals), by step
kind, for each profile given — the validate's "cost model at the live steps" table
(bench.simulator.fidelity_steps) with the power cap's busy share weighted as the event loop weights
it with the opt-in `cap_by_power` on (each prefill span by `ProfileCost.cap_weight`: 1 without the
profile's "sustained_mixed" run, i.e. the default model for every committed profile).
The shares are the model's own (the trace's tau, or the 100 ms window), over the live steps' times.

    python step_table.py R PROFILE [PROFILE ...]
"""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import live_steps, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost


def shares(steps, k, w, tau, window):
    """(weighted prefill share, decode-only share) before step k, as sims.event_loop.cap_shares."""
    t = steps[k]["start"]
    fw = fu = busy = 0.0
    counting = not steps[k]["idle_before"]  # busy time since the last idle spell (busy_since)
    j = k - 1
    while j >= 0 and steps[j]["end"] > t - window:
        a, b = steps[j]["start"], min(steps[j]["end"], t)
        if tau is not None:
            span = math.exp((b - t) / tau) - math.exp((a - t) / tau)
        else:
            span = (b - max(a, t - window)) / window
        if counting:
            busy += span
            counting = not steps[j]["idle_before"]
        if steps[j]["p"]:  # prefill spans count across idle spells
            fw += w[j] * span
            fu += span
        j -= 1
    return fw, max(0.0, busy - fu)


def main(argv):
    R = Path(argv[0])
    tag = R.name
    arr, _ = read_log(R / f"decisions_{tag}.jsonl.gz")
    steps, _ = live_steps(read_steps(R / f"steps_{tag}.jsonl.gz"), {a.request_id: a.max_tokens for a in arr})
    for prof in argv[1:]:
        cost = ProfileCost.from_json(prof, hide_launch=True, power_cap=True, cap_by_power=True)
        tau, window = cost.power_cap_tau_s, cost.power_cap_window_s
        by_compute = cost.caps_by_compute
        w, model = [], []
        for s in steps:
            ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
            w.append(cost.cap_weight(s["d"], s["p"], ctx, s["chunks"] or None) if s["p"] else 0.0)
        for k, s in enumerate(steps):
            if not s["d"] and not s["p"]:
                model.append(None)
                continue
            chunks = s["chunks"] or None
            ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
            t = cost.step_time(s["d"], s["p"], ctx, chunks)
            if window is not None and (s["p"] or by_compute):
                f, g = shares(steps, k, w, tau, window)
                share = cost.compute_share(s["d"], s["p"], ctx, chunks) if by_compute else None
                t *= cost.prefill_slowdown(f, g, share) if share is not None else cost.prefill_slowdown(f, g)
            if s["idle_before"]:
                t += cost.launch_time(s["d"], s["p"])
            model.append(1e3 * t)
        bins = {}
        for k, s in enumerate(steps):
            if model[k] is None:
                continue
            if not s["p"]:
                name = "decode-only" + (", after idle" if s["idle_before"] else "")
            else:
                size = "prefill <= 512" if s["p"] <= 512 else "prefill > 512"
                name = size + (", after idle" if s["idle_before"] else ", busy")
            b = bins.setdefault(name, [0, 0.0, 0.0])
            b[0] += 1
            b[1] += s["ms"]
            b[2] += model[k]
        pc = cost.describe()["power_cap"] or {}
        bp = pc.get("by_power") or {}
        print(f"== {tag} with {Path(prof).name}: r {pc.get('back_to_back', 1):.3f}, tau {pc.get('tau_s')}, "
              f"f_ref {pc.get('f_ref', 0):.3f}; by power: "
              + (f"r_mix {bp['r_mix']:.4f}, w_mix {bp['w_mix']:.3f} at token rate {bp['rate_mix']:.3f}"
                 + (" (WHAT-IF stand-in)" if bp.get("whatif") else "") if bp else "off (every prefill step weighs 1)"))
        print(f"  {'step kind':28s} {'n':>6s} {'live ms':>8s} {'model ms':>9s} {'model/live':>10s}")
        for name in sorted(bins):
            n, lv, md = bins[name]
            print(f"  {name:28s} {n:6d} {lv / n:8.2f} {md / n:9.2f} {md / lv:10.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
