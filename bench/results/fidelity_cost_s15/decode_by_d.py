"""Issue 35, session 15: live decode-only steps by decode batch d against the cost model, around the
decode-graph buckets (read from committed logs; no device time). Prints per d: live steps (decode-only,
after decode-only, not after idle), live median ms, the model's median ms at their composition
(as-run profile: hide launch, power cap by compute share), model/live of totals.

    python decode_by_d.py R TAG [PROFILE]   # R: a grid part's folder (validate, decisions, steps, profile)
"""
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import live_steps, model_step_ms, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost


def decode_rows(R: Path, tag: str, profile: Path | None = None):
    arr, _ = read_log(R / f"decisions_{tag}.jsonl.gz")
    rows = read_steps(R / f"steps_{tag}.jsonl.gz")
    steps, bad = live_steps(rows, {a.request_id: a.max_tokens for a in arr})
    cost = ProfileCost.from_json(profile or R / f"profile_{tag}.json", hide_launch=True, power_cap=True)
    model = {k: t for k, t, _ in model_step_ms(cost, steps)}
    return steps, model, cost, bad


def main(argv):
    R, tag = Path(argv[0]), argv[1]
    prof = Path(argv[2]) if len(argv) > 2 else None
    steps, model, cost, bad = decode_rows(R, tag, prof)
    by = defaultdict(list)
    for k, s in enumerate(steps):
        if s["p"] or not s["d"] or s["idle_before"] or s["prefill_before"] or k not in model:
            continue
        by[s["d"]].append((s["ms"], model[k], s["ctx"] / s["d"]))
    buckets = cost.meta.get("cuda_graph_decode_buckets") or []
    print(f"{R}/{tag}: {len(steps)} live steps ({bad} rebuilt decode counts differ); profile "
          f"{prof or 'as run'}; decode buckets {buckets}")
    print(f"{'d':>4} {'bucket':>6} {'n':>6} {'live ms':>8} {'model ms':>9} {'model/live':>10} {'ctx/seq':>8}")
    tot_l = tot_m = 0.0
    for d in sorted(by):
        a = np.array(by[d])
        b = next((x for x in buckets if x >= d), None)
        tot_l += a[:, 0].sum()
        tot_m += a[:, 1].sum()
        print(f"{d:>4} {b!s:>6} {len(a):>6} {np.median(a[:, 0]):>8.3f} {np.median(a[:, 1]):>9.3f} "
              f"{a[:, 1].sum() / a[:, 0].sum():>10.4f} {np.median(a[:, 2]):>8.0f}")
    print("by decode bucket (the steps of batches (previous bucket, bucket]): model/live of totals, "
          "and at the bucket's first two batches")
    lo = 0
    for b in (buckets or [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]):
        seg = [x for d in sorted(by) if lo < d <= b for x in by[d]]
        first = [x for d in sorted(by) if lo < d <= min(b, lo + 2) for x in by[d]]
        if seg:
            a, f = np.array(seg), np.array(first)
            print(f"  ({lo:>3}, {b:>3}]: {len(a):>6} steps  {a[:, 1].sum() / a[:, 0].sum():.4f}   first two "
                  f"{len(f):>5} steps  {f[:, 1].sum() / f[:, 0].sum():.4f}")
        lo = b
    print(f"all decode-only after decode-only: model/live {tot_m / tot_l:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
