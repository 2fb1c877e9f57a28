"""Issue 35, session 20: the simulator's own steps (the grid state's model, replaying one seed's
runs) against the live ones: decode-only steps' mean time by batch, the steps with prefill, and
what the steps with prefill carry (tokens, decodes beside them). The simulated steps' times are
their starts' differences (back to back only: gaps > 200 ms dropped). Run from the repo root:
    python sim_vs_live_steps.py PART SEED measured|off|KAPPA
"""
import gzip
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import sims.decision_replay as dr
from bench.simulator import validate_replay as vr

BINS = ((1, 1), (2, 8), (9, 16), (17, 32), (33, 64), (65, 256))


def binof(d: int) -> str:
    return next(f"{lo}-{hi}" for lo, hi in BINS if lo <= d <= hi)


def main(part: str, seed: str, spread: str) -> None:
    base = f"bench/results/fidelity_grid_h200_s20/{part}"
    captured = []
    orig = dr.replay_run

    def spy(arr, *a, **k):
        res, b = orig(arr, *a, **k)
        captured.append((arr, res))
        return res, b

    dr.replay_run = spy
    vr.main([f"{base}/validate_{part}.json", f"{base}/decisions_{part}.jsonl.gz", f"{base}/steps_{part}.jsonl.gz",
             "--profile", f"{base}/profile_{part}.json", "--cap-by-power", "--gateway-loop", "on",
             "--plan-lead", "live", "--decode-spread", spread, "--seeds", seed])
    with gzip.open(f"{base}/steps_{part}.jsonl.gz", "rt") as fh:
        rows = [r for r in (json.loads(line) for line in fh) if r.get("ms") is not None]
    for arr, res in captured:
        ids = {a.request_id for a in arr}
        steps = res.extra["steps"]
        sim, simp, simpt = defaultdict(list), [], []
        for (t, _b, d, ch, _pre), nxt in itertools.pairwise(steps):
            dt = (nxt[0] - t) * 1e3
            if dt > 200:
                continue
            (sim[binof(d)] if not ch else simp).append(dt)
            if ch:
                simpt.append((sum(c[1] for c in ch), d))
        # the live steps of this run: from its first prefill to the last step before another run's
        first = next(i for i, r in enumerate(rows) if any(c[0] in ids for c in r["prefill"]))
        j = max(i for i, r in enumerate(rows) if any(c[0] in ids for c in r["prefill"]))
        while (j + 1 < len(rows) and all(c[0] in ids for c in rows[j + 1]["prefill"])
               and rows[j + 1]["mono"] - rows[j]["mono"] < 1.0):
            j += 1
        live, livep, livept = defaultdict(list), [], []
        for r in rows[first:j + 1]:
            d = r["decodes"]
            (live[binof(d)] if not r["prefill"] else livep).append(r["ms"])
            if r["prefill"]:
                livept.append((r["prefill_tokens"], d))
        print(f"== a run of {len(arr)} requests: simulated steps {len(steps)}, live {j + 1 - first}")
        print("   bin       live n  live mean   sim n  sim mean   sim/live")
        for lo, hi in BINS:
            k = f"{lo}-{hi}"
            a, b = live.get(k, []), sim.get(k, [])
            if a and b:
                print(f"   {k:8s} {len(a):7d} {np.mean(a):9.3f} {len(b):7d} {np.mean(b):9.3f}   {np.mean(b) / np.mean(a):8.4f}")
        print(f"   prefill  {len(livep):7d} {np.mean(livep):9.3f} {len(simp):7d} {np.mean(simp):9.3f}   "
              f"{np.mean(simp) / np.mean(livep):8.4f}")
        la, sa = np.array(livept), np.array(simpt)
        print(f"   steps with prefill: mean tokens live {la[:, 0].mean():.1f} sim {sa[:, 0].mean():.1f}; "
              f"mean decodes beside live {la[:, 1].mean():.2f} sim {sa[:, 1].mean():.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
