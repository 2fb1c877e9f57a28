"""Issue 35, session 41: what-if — the limiter's delayed onset, from the profile alone (README section 7).

A step with prefill pays its kind's sustained level for the part of it that runs after the run of steps with prefill
it belongs to (back to back, reset by any decode-only step or idle) has lasted the card's delay D; before that it runs
at the paused profile.
Decode-only steps pay nothing. From the profile:
- D: the pause check's "sustained" trace (the 512-token step back to back from idle) in device time over the same
  step's paused device time (the "stream_kind" prefill run's): the start of the first step past halfway between
  the trace's first two steps and its settled second half;
- the level: the "stream_kind" mixed run's ratio (pipelined over paused, device time), scaled to each step by its
  compute share over the mixed run's step's (`ProfileCost.compute_share`), as the cap scales every kind.
Prints the busy steps with prefill by place in their run (as `burst_place.py`) and per run, model / live, with the
default and `stream_fast` beside it, and the decode-only steps per run.

    python bench/results/pairs_s41/delay_whatif.py PART_DIR [PART_DIR ...]
"""
import json
import statistics
import sys
from pathlib import Path

from bench.simulator import fidelity_steps as fs
from bench.simulator.validate import async_plan_lead, model_terms
from sims.profile_cost import ProfileCost

PLACES = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 10_000))


def delay_and_level(doc: dict) -> tuple[float, float, list[int]] | None:
    runs = doc["pause_check"]["runs"]
    tr = next((r for r in runs if r.get("run") == "sustained" and r.get("trace_device_ms")), None)
    kinds = {r.get("kind"): r for r in runs if r.get("run") == "stream_kind"}
    base = (kinds.get("prefill") or {}).get("paused_device_ms_median")
    if tr is None or not base or "mixed" not in kinds:
        return None
    ratio = [x / base for x in tr["trace_device_ms"]]
    early = statistics.median(ratio[:2])
    settled = statistics.median(ratio[len(ratio) // 2:])
    mid = (early + settled) / 2
    t = tr["trace_t_ms"]
    d_ms = next((t[i] for i, x in enumerate(ratio) if x >= mid), None) if settled > early else None
    return (None if d_ms is None else d_ms / 1e3), float(kinds["mixed"]["ratio"]), list(kinds["mixed"]["shape"])


def main(argv: list[str]) -> None:
    for arg in argv:
        part = Path(arg)
        prof, doc, steps = fs.part_live_steps(part)
        terms = model_terms(doc, async_plan_lead(doc, "cuda"))
        paused = ProfileCost.from_json(prof, **{**terms, "power_cap": False, "cap_by_power": False})
        costs = {"default": ProfileCost.from_json(prof, **terms),
                 "stream_fast": ProfileCost.from_json(prof, **terms, cap_anchors="stream", cap_onset="fast")}
        models = {n: {i: t for i, t, _f in fs.model_step_ms(c, steps)} for n, c in costs.items()}
        base = {i: t for i, t, _f in fs.model_step_ms(paused, steps)}
        got = delay_and_level(json.loads(Path(prof).read_text()))
        if got is None or got[0] is None:
            print(f"== {part}: the profile gives no delay (no device trace, or a trace that does not rise)")
            delay_s, level, shape = float("inf"), 1.0, None
        else:
            delay_s, level, shape = got
        d0, p0, c0 = shape[:3] if shape else (0, 0, 0)
        share_mix = paused.compute_share(d0, p0, d0 * c0 + p0) if shape else 1.0
        delay = {}
        burst_t0, place = None, 0
        prev_end = None
        for i, s in enumerate(steps):
            if not s["d"] and not s["p"]:
                continue
            if s["p"]:
                fresh = place == 0 or s.get("idle_before") or (prev_end is not None and s["start"] - prev_end > 0.002)
                if fresh:
                    burst_t0, place = s["start"], 0
                place += 1
                s["_place"] = place
                ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
                sh = paused.compute_share(s["d"], s["p"], ctx, s["chunks"] or None)
                if i in base:
                    # the part of the step past the delay pays the level (a step across the onset: its share)
                    dur = base[i] / 1e3
                    frac = min(1.0, max(0.0, (s["start"] + dur - (burst_t0 + delay_s)) / dur)) if dur > 0 else 0.0
                    delay[i] = base[i] * (1.0 + (level - 1.0) * sh / share_mix * frac)
            else:
                place = 0
                if i in base:
                    delay[i] = base[i]
            prev_end = s["end"]
        models["delay"] = delay
        print(f"== {part}: delay {1e3 * delay_s:.1f} ms, level {level:.4f} (stream_kind mixed {shape})")
        labels = [lo for lo, _ in fs.validate_run_labels(part)]
        runs = fs.runs_at_gaps(steps, 1.0)
        acc, per_run = {}, []
        for k, idx in enumerate(runs):
            load = labels[k] if len(labels) == len(runs) else ("0.5x", "0.8x", "0.95x")[k % 3]
            pre = [i for i in idx if steps[i]["p"] and not steps[i].get("idle_before") and i in base
                   and all(i in m for m in models.values())]
            dec = [i for i in idx if not steps[i]["p"] and steps[i]["d"] and i in base
                   and all(i in m for m in models.values())]
            live_p, live_d = sum(steps[i]["ms"] for i in pre), sum(steps[i]["ms"] for i in dec)
            per_run.append((f"{load} run {k}", len(pre),
                            *(sum(models[n][i] for i in pre) / live_p for n in ("default", "stream_fast", "delay")),
                            *(sum(models[n][i] for i in dec) / live_d for n in ("default", "stream_fast", "delay"))))
            for i in pre:
                b = next(j for j, (lo, hi) in enumerate(PLACES) if lo <= steps[i]["_place"] <= hi)
                a = acc.setdefault((load, b), [0.0, 0.0, 0.0, 0.0, 0])
                a[0] += steps[i]["ms"]
                a[1] += models["default"][i]
                a[2] += models["stream_fast"][i]
                a[3] += models["delay"][i]
                a[4] += 1
        print(f"{'load':6s} {'place':>6s} {'n':>6s} {'default':>8s} {'s_fast':>8s} {'delay':>8s}   (model / live)")
        for load in ("0.5x", "0.8x", "0.95x"):
            for b, (lo, hi) in enumerate(PLACES):
                a = acc.get((load, b))
                if a and a[4] >= 20:
                    place = f"{lo}" if lo == hi else f"{lo}-{hi}" if hi < 10_000 else f"{lo}+"
                    print(f"{load:6s} {place:>6s} {a[4]:6d} {a[1] / a[0]:8.4f} {a[2] / a[0]:8.4f} {a[3] / a[0]:8.4f}")
        print(f"{'run':16s} {'n':>5s} {'with prefill: default':>22s} {'s_fast':>7s} {'delay':>7s}   "
              f"{'decode-only: default':>21s} {'s_fast':>7s} {'delay':>7s}")
        for row in per_run:
            print(f"{row[0]:16s} {row[1]:5d} {row[2]:22.4f} {row[3]:7.4f} {row[4]:7.4f}   {row[5]:21.4f} {row[6]:7.4f} "
                  f"{row[7]:7.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
