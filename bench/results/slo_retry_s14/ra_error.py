"""Issue 31, fourteenth session: the Retry-After's error against the wait the refused request
would have had, |Retry-After / wait - 1|: its median, its p90 and the share within +-25%.

    python ra_error.py sim STUDY.json[.gz] [ALT ...]   # `tidegate sim retry-bound` --json:
        # each refusal's Retry-After ("current", or an alternative's: point, quantile_0.5, ...)
        # against every forked world's wait (pooled) and its own future's (the simulated probe)
    python ra_error.py live RUN_DIR ...           # scripts/gpu_slo_run.sh outputs: each probed
        # refusal's Retry-After against its probe's TTFT (records_a.jsonl[.gz]), pooled over runs
"""
from __future__ import annotations

import gzip
import json
import os
import sys

import numpy as np

CLASSES = ("fast", "normal", "slow")


def stats(err: list[float]) -> str:
    e = np.abs(np.asarray(err, dtype=float))
    if not len(e):
        return "n 0"
    return (f"n {len(e):4d}  |err| p50 {np.median(e):5.2f}  p90 {np.percentile(e, 90):5.2f}  "
            f"within +-25% {100 * np.mean(e <= 0.25 + 1e-12):5.1f}%")


def sim(path: str, alts: list[str]) -> None:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as fh:
        res = json.load(fh)
    for alt in alts or ["current"]:
        print(f"== {os.path.basename(path)}: {alt}")
        for cls in CLASSES:
            rows = [r for r in res["rows"] if r["class"] == cls]
            if not rows:
                continue
            worlds, own = [], []
            for r in rows:
                ra = r["retry_after_s"] if alt == "current" else r["alternatives"][alt]["retry_after_s"]
                worlds += [ra / w - 1.0 for w in r["waits_s"] if w > 0]
                own.append(ra / r["own_future_wait_s"] - 1.0)
            print(f"  {cls:<6} refusals {len(rows):3d}  worlds: {stats(worlds)}")
            print(f"  {cls:<6}                own future: {stats(own)}")


def live(runs: list[str]) -> None:
    by: dict[str, list[float]] = {c: [] for c in (*CLASSES, "all")}
    for run in runs:
        path = os.path.join(run, "records_a.jsonl")
        opener = open
        if not os.path.exists(path):
            path, opener = path + ".gz", gzip.open
        with opener(path, "rt") as fh:
            for line in fh:
                r = json.loads(line)
                if r["error"] == "http_429" and r["probe_ttft_s"] and r["retry_after_s"] is not None:
                    e = r["retry_after_s"] / r["probe_ttft_s"] - 1.0
                    by[r["class"]].append(e)
                    by["all"].append(e)
    print(f"== live probes, {len(runs)} runs: {' '.join(os.path.basename(r.rstrip('/')) for r in runs)}")
    for c, e in by.items():
        print(f"  {c:<6} {stats(e)}")


if __name__ == "__main__":
    kind, *rest = sys.argv[1:]
    if kind == "sim":
        sim(rest[0], rest[1:])
    else:
        live(rest)
