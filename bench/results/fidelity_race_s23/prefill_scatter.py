"""Is a prefill step's own scatter like a decode-only step's? (issue 35, session 23)

The schedule's ceiling (`bench.simulator.schedule_ceiling`) draws every step's scatter from
back-to-back decode-only steps at one decode count, prefill steps included: session 22 left that
as a caveat (the ceilings could be optimistic if prefill steps scatter more). Three samples of a
part, each a log ratio of back-to-back steps of one shape over sqrt 2:

- decode: `schedule_ceiling.step_scatter` on the live step log (what the ceiling draws);
- live prefill same shape: `schedule_ceiling.prefill_step_scatter` (each prefill step against the
  last step of exactly its shape, at most 4 steps before: what the ceiling draws since session 23
  where it has >= 100 pairs);
- live prefill: back-to-back live steps that both carry prefill, with the same decode count and the
  same prefill tokens (equal prompts: a 512-token prompt's two 256-token chunks; their attention
  differs by the chunk's position, so this over-reads the scatter a little);
- sustained: the profile's pause check runs back to back at one shape (`sustained`: a 256-token
  chunk alone; `sustained_mixed`: with 32 decodes; `sustained_packed`: the packed step), each run's
  trace of step times (its slow power-cap drift cancels in back-to-back ratios).

usage: python prefill_scatter.py <part dir> [...]
"""
from __future__ import annotations

import gzip
import json
import math
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np

from bench.simulator.schedule_ceiling import prefill_step_scatter, robust_sd, step_scatter


def describe(name: str, v: np.ndarray) -> str:
    if not len(v):
        return f"  {name:<24} n=0"
    a = np.abs(v)
    return (f"  {name:<24} n={len(v):>5}  robust sd {100 * robust_sd(v):.2f}%  sd {100 * v.std():.2f}%  "
            f"|r| p90 {100 * np.percentile(a, 90):.2f}%  p99 {100 * np.percentile(a, 99):.2f}%")


def live_prefill_scatter(rows: list[dict]) -> np.ndarray:
    r = [math.log(float(b["ms"]) / float(a["ms"])) for a, b in pairwise(rows)
         if a["prefill"] and b["prefill"] and a["decodes"] == b["decodes"]
         and a["prefill_tokens"] == b["prefill_tokens"] and not a.get("drafts") and not b.get("drafts")
         and float(a["ms"]) > 0 and float(b["ms"]) > 0]
    return np.asarray(r, dtype=float) / math.sqrt(2.0)


def sustained_scatter(profile: dict) -> dict[str, np.ndarray]:
    out = {}
    for run in (profile.get("pause_check") or {}).get("runs", []):
        ms = run.get("trace_ms")
        if ms and len(ms) > 2:
            ms = np.asarray(ms, dtype=float)
            out[run["run"]] = np.diff(np.log(ms)) / math.sqrt(2.0)
    return out


def main(argv: list[str]) -> int:
    for d in map(Path, argv):
        (steps,) = d.glob("steps_*.jsonl.gz")
        with gzip.open(steps, "rt") as f:
            rows = [json.loads(x) for x in f if x.strip()]
        print(f"{d}: {len(rows)} live steps")
        print(describe("decode (the ceiling's)", step_scatter(rows)))
        print(describe("live prefill", live_prefill_scatter(rows)))
        print(describe("live prefill same shape", prefill_step_scatter(rows)))
        for prof in d.glob("profile_*.json"):
            for name, v in sustained_scatter(json.loads(prof.read_text())).items():
                print(describe(name, v))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
