"""Issue 35, session 15 (H35G): drive.py's runs read back. The echo engine logs no steps, so the
gateway loop's busy periods are read from the client's side: every step's tokens reach the client as
one burst (chunks within GAP ms of each other), from the gateway's first write to its last, so a burst
[first, last] is (shifted by the client's read, ~constant) the loop's job for that step. Per run:

- the burst's length per stream ((last - first) / (chunks - 1)) against the gateway's CPU per streamed
  token (/proc: what the loop spends a stream);
- the timer-fired windows' lateness (decision log: flush - (window start + 5 ms)) live, against
  (a) the observed bursts: the timer's idle lateness + what is left of the burst its deadline falls
      in (the mechanism alone, no fitted term), and
  (b) the model: bursts rebuilt as the gateway's CPU per token x the burst's chunks from its first
      chunk (bench.simulator.gateway_loop's single server with the measured cost);
  the timer's idle lateness: the lowest rate's median outside every burst.

    python analyze.py OUT [--gap-ms 2] [--shift-ms 0]
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from bench.simulator.gateway_loop import residual_at
from scheduler.decisions import read_log


def bursts(chunks: np.ndarray, gap_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, last, count) of each burst of chunk arrivals (gaps > gap_s part them)."""
    if not len(chunks):
        return np.array([]), np.array([]), np.array([], dtype=int)
    cut = np.flatnonzero(np.diff(chunks) > gap_s) + 1
    idx = np.concatenate([[0], cut, [len(chunks)]])
    first, last = chunks[idx[:-1]], chunks[idx[1:] - 1]
    return first, last, np.diff(idx)


def fifo(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    ends, free = np.empty(len(starts)), -np.inf
    for i, (t, s) in enumerate(zip(starts, sizes, strict=True)):
        free = max(free, t) + s
        ends[i] = free
    return ends


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--gap-ms", type=float, default=2.0)
    p.add_argument("--shift-ms", type=float, default=0.0, help="client read delay taken off the bursts")
    a = p.parse_args()
    out = Path(a.out)
    runs = json.loads((out / "runs.json").read_text())
    arrivals, batches = read_log(str(out / "decisions.jsonl"))
    push = {x.request_id: x.t for x in arrivals}
    per = []
    for k, r in enumerate(runs):
        dl, late = [], []
        for b in batches:
            ts = [push[i] for i in b.request_ids if i in push]
            if ts and r["t0"] <= min(ts) <= r["t1"] and b.t - min(ts) >= 0.0049:
                dl.append(min(ts) + 0.005)
                late.append(b.t - min(ts) - 0.005)
        f, la, n = bursts(np.load(out / f"chunks_{k}.npy"), a.gap_ms / 1e3)
        f, la = f - a.shift_ms / 1e3, la - a.shift_ms / 1e3
        per.append((r, np.array(dl), np.array(late), f, la, n))
    _r0, dl0, late0, f0, la0, _ = per[0]
    idle = float(np.median(late0[residual_at(f0, la0, dl0) <= 0]))
    print(f"gap {a.gap_ms} ms, shift {a.shift_ms} ms; timer idle lateness {1e3 * idle:.3f} ms (lowest rate, outside bursts)")
    print(f"{'rate':>5} {'windows':>7} {'streams':>7} {'burst ms/stream':>15} {'cpu ms/tok':>10} {'live mean':>9} "
          f"{'bursts mean':>11} {'model mean':>10} {'live p90':>8} {'bursts p90':>10} {'model p90':>9} "
          f"{'in burst':>8} {'ttft p50':>8} {'load1':>5}")
    res = []
    for r, dl, late, f, la, n in per:
        multi = n > 1
        per_stream = float(np.median((la[multi] - f[multi]) / (n[multi] - 1))) if multi.any() else float("nan")
        obs = idle + residual_at(f, la, dl + idle)
        model_end = fifo(f, r["cpu_ms_per_token"] / 1e3 * n)
        mod = idle + residual_at(f, model_end, dl + idle)
        row = {"rate": r["rate"], "windows": len(dl), "streams": float(np.median(n)),
               "burst_ms_per_stream": 1e3 * per_stream, "cpu_ms_per_token": r["cpu_ms_per_token"],
               "live_mean_ms": 1e3 * late.mean(), "bursts_mean_ms": 1e3 * obs.mean(),
               "model_mean_ms": 1e3 * mod.mean(), "live_p90_ms": 1e3 * np.percentile(late, 90),
               "bursts_p90_ms": 1e3 * np.percentile(obs, 90), "model_p90_ms": 1e3 * np.percentile(mod, 90),
               "inside_burst": float((obs > idle).mean()), "ttft_p50_ms": r["ttft_p50_ms"],
               "loadavg_1m": r["loadavg"][0]}
        res.append(row)
        print(f"{r['rate']:5.0f} {len(dl):7d} {row['streams']:7.0f} {row['burst_ms_per_stream']:15.4f} "
              f"{r['cpu_ms_per_token']:10.4f} {row['live_mean_ms']:9.2f} {row['bursts_mean_ms']:11.2f} "
              f"{row['model_mean_ms']:10.2f} {row['live_p90_ms']:8.2f} {row['bursts_p90_ms']:10.2f} "
              f"{row['model_p90_ms']:9.2f} {row['inside_burst']:8.2f} {r['ttft_p50_ms']:8.1f} {r['loadavg'][0]:5.2f}")
    (out / f"analysis_gap{a.gap_ms:g}.json").write_text(json.dumps({"gap_ms": a.gap_ms, "shift_ms": a.shift_ms,
                                                                  "idle_late_ms": 1e3 * idle, "runs": res},
                                                                 indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
