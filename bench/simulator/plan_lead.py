"""How long before a step's read-back the live engine planned the next one (issue 35): the async
loop's lead (`sims.event_loop.EngineConfig.async_plan_lead_s`, `async_plan_lead_prefill_s`),
measured on a session's step log instead of taken from the profile (twice the launch + 1 ms).

A request the backend receives after the plan of step k+1 waits for step k+2: the later the plan,
the more requests join the next step. The step log gives each step's end (`mono` + `ms`, its
read-back) and its host phases (`host_ms`: planning, launch, launch -> read-back, after it), so its
plan began at end - sum(host_ms). For two back-to-back steps (k+1 starting within 0.5 ms of k's
read-back) the lead is k's end - k+1's plan start. On the H200 6.7B (session 14): 2.22 ms median
after a decode-only step, 3.62 ms after a step carrying prefill, against the profile's 1.75 ms —
a request reaching the engine in that gap joins a step later live than simulated.

    python -m bench.simulator.plan_lead STEPS.jsonl[.gz] [...]
"""
from __future__ import annotations

import itertools
import sys

import numpy as np


def step_leads(step_rows: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """(ms of the step, lead ms before its end) for every back-to-back pair in the log, by the
    kind of the step planned behind: after decode-only steps, after steps with prefill."""
    rows = sorted((r for r in step_rows if "mono" in r), key=lambda r: r["mono"])
    out: dict[str, list[tuple[float, float]]] = {"decode": [], "prefill": []}
    for a, b in itertools.pairwise(rows):
        hp = b.get("host_ms")
        if not hp or not (a["decodes"] or a["prefill"]):
            continue
        end_a = a["mono"] + a["ms"] / 1e3
        if b["mono"] - end_a > 0.0005:  # not back to back (an idle spell)
            continue
        plan_b = b["mono"] + b["ms"] / 1e3 - sum(hp) / 1e3
        out["prefill" if a["prefill"] else "decode"].append((float(a["ms"]), 1e3 * (end_a - plan_b)))
    return out


def plan_leads(step_rows: list[dict]) -> dict:
    """Median and mean lead (ms) after decode-only steps and after steps with prefill, and counts."""
    res = {}
    for k, v in step_leads(step_rows).items():
        x = np.array([lead for _, lead in v])
        res[k] = {"median_ms": float(np.median(x)) if len(x) else None,
                  "mean_ms": float(x.mean()) if len(x) else None, "num_steps": len(x)}
    return res


def plan_lead_lines(step_rows: list[dict], num_bins: int = 10) -> dict:
    """The lead as a line in the duration of the step it plans behind, per kind (after decode-only
    steps, after steps with prefill): a least-squares line through the medians of `num_bins`
    equal-count bins of that duration (the medians: a few steps planned late by a host hiccup
    would tilt a line through every point). Returns {kind: {"a_ms", "b", "lo_ms", "hi_ms",
    "num_steps"}}: lead = a_ms + b x the step's ms, held inside the bins' lowest and highest median
    lead [lo_ms, hi_ms] (`EngineConfig.async_plan_lead_line`)."""
    pts = step_leads(step_rows)
    out = {}
    for kind, v in pts.items():
        if len(v) < 2 * num_bins:
            raise ValueError(f"too few back-to-back steps after {kind} steps for a line: {len(v)}")
        x = np.array(v)
        x = x[np.argsort(x[:, 0])]
        bins = np.array_split(x, num_bins)
        mx = np.array([np.median(c[:, 0]) for c in bins])
        my = np.array([np.median(c[:, 1]) for c in bins])
        b, a = np.polyfit(mx, my, 1)
        out[kind] = {"a_ms": float(a), "b": float(b), "lo_ms": float(my.min()), "hi_ms": float(my.max()),
                     "num_steps": len(v)}
    return out


def engine_fields(leads: dict, stat: str = "median_ms") -> dict:
    """The `EngineConfig` fields for leads in `plan_leads`' shape (or `validate.profile_plan_leads`'):
    the lead after decode-only steps and the one after steps with prefill, in seconds."""
    out = {"async_plan_lead_s": leads["decode"][stat] / 1e3,
           "async_plan_lead_prefill_s": leads["prefill"][stat] / 1e3}
    if "lines" in leads:  # plan_lead_lines' fits: the lead by the ending step's duration
        ln = leads["lines"]
        out["async_plan_lead_line"] = tuple((ln[k]["a_ms"] / 1e3, ln[k]["b"], ln[k]["lo_ms"] / 1e3,
                                             ln[k]["hi_ms"] / 1e3) for k in ("decode", "prefill"))
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.simulator.fidelity_steps import read_steps

    for path in (argv if argv is not None else sys.argv[1:]):
        rows = read_steps(path)
        r = plan_leads(rows)
        print(path + ": " + "; ".join(
            f"after {k}: median {v['median_ms']:.2f} ms, mean {v['mean_ms']:.2f} ms ({v['num_steps']} steps)"
            for k, v in r.items() if v["num_steps"]))
        try:
            ln = plan_lead_lines(rows)
            print("    as a line in the step's ms: " + "; ".join(
                f"after {k}: {v['a_ms']:.2f} ms + {v['b']:.3f} x ms in [{v['lo_ms']:.2f}, {v['hi_ms']:.2f}]"
                for k, v in ln.items()))
        except ValueError as e:
            print(f"    no line: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
