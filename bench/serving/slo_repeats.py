"""How far can any Retry-After get, live? Repeated runs of one schedule (issue 31).

The Retry-After goal asks that a refused request's Retry-After be within +-25% of the wait it would
have had, measured by sending it anyway (`bench.serving.slo_control --probe-every`). Repeat the
same run (same seed: the same arrivals, classes and lengths, so the same future) and the same
request is refused and probed in many repeats. Its probe waits across the repeats show what the
live system does not decide from the state a Retry-After can see:

- **spread**: per request probed in >= 3 repeats, the waits' p90 / p10;
- **leave-one-out**: each probe's wait predicted by the median of the other repeats' waits of the
  same request (a predictor that knows the whole future schedule), optionally only from repeats
  whose state at the refusal matched this one's: the gateway's own Retry-After within `ra_tol`
  (it is a function of the state the admission check read) and/or the same decisions (refused,
  probed) for every request sent in the `history_s` seconds before (`--history-s`);
- **pairs**: two probes of one request with matching states whose waits differ by more than
  (1 + tol) / (1 - tol) = x1.67: no Retry-After can be within +-25% of both. A deterministic rule
  of the state hits h_s of the probes from state s, both of two independent repeats with
  probability h_s^2 <= c_s, the chance that two waits from s are compatible; so its hit rate is at
  most E[sqrt(c_s)] <= sqrt(1 - q), q the share of incompatible pairs (`bound`). The bound holds
  as far as the matched states are the same state.

    python -m bench.serving.slo_repeats live RUN_DIR ... [--ra-tol 0.05] [--history-s 1]
    python -m bench.serving.slo_repeats sim SIM.json ...   # bench/results/slo_cpu_s15/jitter_repeats.py

RUN_DIR: `scripts/gpu_slo_run.sh` outputs of one schedule (records_a.jsonl[.gz]).
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

TOLERANCE = 0.25


@dataclass(frozen=True)
class Probe:
    repeat: str          # the run it came from
    request: int         # index in the schedule (the same request in every repeat)
    cls: str
    retry_after_s: float
    wait_s: float
    history: tuple = ()  # decisions on the requests sent shortly before (`--history-s`)


def hit(r: float, w: float, tol: float = TOLERANCE) -> bool:
    """|r / w - 1| <= tol."""
    return w > 0 and abs(r / w - 1.0) <= tol + 1e-12


def compatible(w1: float, w2: float, tol: float = TOLERANCE) -> bool:
    """Whether one Retry-After can be within +-tol of both waits."""
    lo, hi = sorted((w1, w2))
    return lo > 0 and hi / lo <= (1 + tol) / (1 - tol) + 1e-12


def _records(run: str) -> list[dict]:
    path = os.path.join(run, "records_a.jsonl")
    opener = open
    if not os.path.exists(path):
        path, opener = path + ".gz", gzip.open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def load_live(runs: list[str], history_s: float = 0.0) -> list[Probe]:
    """Every probed refusal of each run (records_a: class, send time, outcome, Retry-After,
    probe's TTFT), with the decisions on the requests sent in the `history_s` s before it."""
    out = []
    for run in runs:
        recs = _records(run)
        for d in recs:
            if d["error"] != "http_429" or not d["probe_ttft_s"] or d["retry_after_s"] is None:
                continue
            hist: tuple = ()
            if history_s > 0:
                t = d["send_s"]
                hist = tuple((k, recs[k]["error"] == "http_429", recs[k]["probe_ttft_s"] is not None)
                             for k in range(d["i"]) if recs[k]["send_s"] >= t - history_s)
            out.append(Probe(os.path.basename(run.rstrip("/")), int(d["i"]), d["class"],
                             float(d["retry_after_s"]), float(d["probe_ttft_s"]), hist))
    return out


def load_sim(paths: list[str]) -> list[Probe]:
    """Rows of `jitter_repeats.py` (repeat = jitter seed; one simulated probe per refusal)."""
    out = []
    for path in paths:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as fh:
            res = json.load(fh)
        out += [Probe(f"{os.path.basename(path)}:{r['repeat']}", int(r["i"]), r["class"],
                      float(r["retry_after_s"]), float(r["wait_s"])) for r in res["rows"]]
    return out


def _matches(a: Probe, b: Probe, ra_tol: float | None, history: bool) -> bool:
    if a.repeat == b.repeat:
        return False
    if ra_tol is not None and abs(b.retry_after_s / a.retry_after_s - 1.0) > ra_tol:
        return False
    return not history or a.history == b.history


def repeat_scores(probes: list[Probe], cls: str, ra_tol: float | None = None,
                  history: bool = False, tol: float = TOLERANCE) -> dict:
    """The module doc's figures for one class. Only probes with at least one matching probe of
    the same request in another repeat are scored ("covered")."""
    by: dict[int, list[Probe]] = defaultdict(list)
    for p in probes:
        if p.cls == cls:
            by[p.request].append(p)
    loo, own, spreads = [], [], []
    pairs = incompatible = 0
    for group in by.values():
        if len({p.repeat for p in group}) >= 3:
            w = [p.wait_s for p in group]
            spreads.append(float(np.percentile(w, 90) / np.percentile(w, 10)))
        for j, p in enumerate(group):
            others = [q.wait_s for q in group if _matches(p, q, ra_tol, history)]
            if not others:
                continue
            loo.append(hit(float(np.median(others)), p.wait_s, tol))
            own.append(hit(p.retry_after_s, p.wait_s, tol))
            for k, q in enumerate(group):
                if k > j and _matches(p, q, ra_tol, history):
                    pairs += 1
                    incompatible += not compatible(p.wait_s, q.wait_s, tol)
    n = sum(len(g) for g in by.values())
    q = incompatible / pairs if pairs else None
    return {"class": cls, "probes": n, "requests": len(by),
            "covered": len(loo),
            "rule_hit_covered": float(np.mean(own)) if own else None,
            "loo_median_hit": float(np.mean(loo)) if loo else None,
            "pairs": pairs, "incompatible": q,
            "bound": math.sqrt(1.0 - q) if q is not None else None,
            "spread_p90_over_p10_p50": float(np.median(spreads)) if spreads else None,
            "requests_in_3_repeats": len(spreads),
            "rule_hit_all": float(np.mean([hit(p.retry_after_s, p.wait_s, tol)
                                           for g in by.values() for p in g])) if n else None}


def _fmt(v, pct: bool = True) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.2f}"


def table(probes: list[Probe], classes: list[str], conditions: list[tuple[str, float | None, bool]]
          ) -> str:
    lines = [("| class | state matched | probes (requests) | rule within +-25% (all) | covered | "
              "rule on covered | LOO median of the other repeats | pairs | incompatible | "
              "bound sqrt(1-q) | spread p90/p10 (p50 over requests) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cls in classes:
        for name, ra_tol, hist in conditions:
            s = repeat_scores(probes, cls, ra_tol, hist)
            if not s["probes"]:
                continue
            lines.append(
                f"| {cls} | {name} | {s['probes']} ({s['requests']}) | {_fmt(s['rule_hit_all'])} | "
                f"{s['covered']} | {_fmt(s['rule_hit_covered'])} | {_fmt(s['loo_median_hit'])} | "
                f"{s['pairs']} | {_fmt(s['incompatible'])} | {_fmt(s['bound'])} | "
                f"{_fmt(s['spread_p90_over_p10_p50'], pct=False)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.slo_repeats", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=("live", "sim"))
    p.add_argument("paths", nargs="+")
    p.add_argument("--classes", default="slow,normal")
    p.add_argument("--ra-tol", type=float, action="append", default=None,
                   help="state matched by the Retry-After within this fraction (repeatable)")
    p.add_argument("--history-s", type=float, default=1.0,
                   help="live: also match the decisions on the requests of the last S s")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    probes = (load_live(a.paths, a.history_s) if a.kind == "live" else load_sim(a.paths))
    conditions: list[tuple[str, float | None, bool]] = [("same request", None, False)]
    for t in a.ra_tol or [0.05]:
        conditions.append((f"Retry-After within {100 * t:g}%", t, False))
    if a.kind == "live" and a.history_s > 0:
        conditions.append((f"decisions of the last {a.history_s:g} s", None, True))
        for t in a.ra_tol or [0.05]:
            conditions.append((f"both ({100 * t:g}%, {a.history_s:g} s)", t, True))
    classes = [c.strip() for c in a.classes.split(",")]
    print(f"{len(probes)} probes from {len({x.repeat for x in probes})} repeats")
    print(table(probes, classes, conditions))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({c: {name: repeat_scores(probes, c, t, h) for name, t, h in conditions}
                       for c in classes}, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
