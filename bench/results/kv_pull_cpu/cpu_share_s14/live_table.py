"""The live runs of this folder as table rows: goodput per mode, pulls, CPU seconds per request
of the backends / the gateway / the load generator, load average, and each run's steps against
the processor-sharing law (live step time over the profile's solo time, by how many backends
were in a step at once, against max(1, busy / cores)).
    .venv/bin/python bench/results/kv_pull_cpu/cpu_share_s14/live_table.py PROFILE [HOST_MS] DIR...
HOST_MS (a number): the backend's host time per step added to each profile step (the
simulator's --step-host-ms).
"""
import gzip
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from sims.kv_pull_study import _step_log_rows


def cpu(path):
    d = {}
    for line in Path(path).read_text().splitlines():
        k, *v = line.split()
        d.setdefault(k, []).append([float(x) for x in v])
    be = sum(e[0] - s[0] for s, e in zip(d["backend_start"], d["backend_end"]))
    gw = d["gateway_end"][0][0] - d["gateway_start"][0][0]
    lg = sum(d["loadgen_user_sys_wall"][0][:2])
    return be, gw, lg


def busy_law(profile, paths, cores=2.0, host_s=0.0):
    """(busy bucket, steps, live/solo, predicted) rows: each step's mean number of backends in a
    step while it ran (itself included) from the logs' start times and durations."""
    rows = _step_log_rows(profile, paths)
    spans = []
    for path in paths:
        with gzip.open(path, "rt") as fh:
            for line in fh:
                r = json.loads(line)
                spans.append((r["mono"], r["mono"] + r["ms"] / 1e3))
    ev = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    ts = np.array([t for t, _ in ev])
    cnt = np.cumsum([d for _, d in ev])
    busy = []
    for s, e in spans:
        i0, i1 = np.searchsorted(ts, s, "right"), np.searchsorted(ts, e, "left")
        pts = [s, *ts[i0:i1], e]
        cs = [cnt[i0 - 1], *cnt[i0:i1]]
        busy.append(sum((pts[k + 1] - pts[k]) * cs[k] for k in range(len(cs))) / max(e - s, 1e-12))
    busy = np.array(busy)
    live = np.array([r[0] for r in rows])
    solo = np.array([r[1] for r in rows]) + host_s
    out = []
    for lo, hi in [(0, 1.5), (1.5, 2.5), (2.5, 3.5), (3.5, 9)]:
        m = (busy >= lo) & (busy < hi)
        if m.any():
            out.append((f"{lo}-{hi}", int(m.sum()), live[m].sum() / solo[m].sum(),
                        float(np.average(np.maximum(1, busy[m] / cores), weights=solo[m]))))
    return out, live.sum(), solo.sum()


def main():
    profile, dirs = sys.argv[1], sys.argv[2:]
    host_s = 0.0
    try:
        host_s, dirs = float(dirs[0]) / 1e3, dirs[1:]
    except ValueError:
        pass
    for d in map(Path, dirs):
        load = (d / "load.txt").read_text().split("\n")
        print(f"## {d.name}: load {load[0].split('load average:')[-1].strip()} -> "
              f"{load[1].split('load average:')[-1].strip() if len(load) > 1 else '?'}")
        for live in sorted(d.glob("live_*.json")):
            mode = live.stem[5:]
            r = json.loads(live.read_text())
            n = r["num_requests"]
            be, gw, lg = cpu(d / f"cpu_{mode}.txt")
            pulls = hit = float("nan")
            bj = d / f"backends_{mode}.json"
            if bj.exists():
                try:
                    bs = json.loads(bj.read_text())
                    pulls = sum(b["num_kv_pulls"] for b in bs)
                    fails = sum(b["num_kv_pull_failures"] for b in bs)
                    hit = (sum(b["num_cached_prompt_tokens"] for b in bs)
                           / max(1, sum(b["num_prompt_tokens"] for b in bs)))
                    pulls = f"{pulls} ({fails} failed)"
                except (ValueError, KeyError, TypeError):
                    pass
            steps = sorted(d.glob(f"steps_{mode}_*.jsonl.gz"))
            law, ls, ss = busy_law(profile, [str(p) for p in steps], host_s=host_s)
            print(f"{mode:7} goodput {100 * r['goodput_fraction']:5.1f}%  TTFT p50 {r['ttft_ms']['p50']:.0f} "
                  f"p99 {r['ttft_ms']['p99']:.0f} ms  CPU ms/request: backends {1e3 * be / n:.1f} "
                  f"gateway {1e3 * gw / n:.1f} loadgen {1e3 * lg / n:.1f}  steps live/solo {ls / ss:.2f}"
                  f"  pulls {pulls}  hit rate {hit:.3f}")
            for b, k, ratio, pred in law:
                print(f"    busy {b:7} {k:5d} steps  live/solo {ratio:5.2f}  law {pred:5.2f}")


if __name__ == "__main__":
    main()
