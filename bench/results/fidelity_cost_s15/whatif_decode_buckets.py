"""Issue 35, session 15, a WHAT-IF (not a measurement, not a validation): the decode points the
profiler now measures at every decode-graph bucket's first batch (`backend profile
--decode-bucket-points on`: the first two batches past each bucket, 3, 5, 6, 9, 10, 17, 18, 25, 26,
33, 34, 49, 50 beside the grid's 1-64, and the buckets 24 / 48
where a profile lacks them), stood in from the live steps, so that the cost model's bucket-by-bucket
interpolation (sims.profile_cost, "Decode-graph buckets") can be scored on committed logs before the
device measures them.

Each stand-in point (d, L) takes the profile's own point at the largest measured decode batch
d' < d at the same context length L and moves its device part (step - launch) by the live ratio
median(d) / median(d') of the live decode-only steps after a decode-only step (all seeds, every
context: ~580 tokens a sequence). Only the jump's ratio comes from the live side; the level stays
the profile's. Its launch is the point d''s. The profile also gets the engine's default decode
buckets (`cuda_graph_decode_buckets`) where it lacks them (the 33B profiles of sessions 11/13).

    python whatif_decode_buckets.py PROFILE STEPS DECISIONS OUT_PROFILE [--no-firsts]

--no-firsts: the bucket points alone (what the session-14 profiler measured), for comparison.
"""
import copy
import json
import sys
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import live_steps, read_steps
from scheduler.decisions import read_log

CUDA_DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)  # the engine's defaults


def live_decode_medians(steps_path, decisions_path) -> dict[int, tuple[float, int]]:
    arr, _ = read_log(decisions_path)
    steps, _ = live_steps(read_steps(steps_path), {a.request_id: a.max_tokens for a in arr})
    by = defaultdict(list)
    for s in steps:
        if s["d"] and not s["p"] and not s["idle_before"] and not s["prefill_before"]:
            by[s["d"]].append(s["ms"])
    return {d: (float(np.median(v)), len(v)) for d, v in by.items()}


def main(argv):
    prof_path, steps_path, dec_path, out = argv[:4]
    firsts = "--no-firsts" not in argv[4:]
    doc = json.loads(Path(prof_path).read_text())
    new = copy.deepcopy(doc)
    buckets = [b for b in (doc.get("cuda_graph_decode_buckets") or CUDA_DECODE_BUCKETS)
               if b <= int(doc.get("max_num_seqs", 256))]
    new["cuda_graph_decode_buckets"] = buckets
    dec = [p for p in doc["points"] if not p["num_prefill_tokens"]]
    have = {(p["num_decode_seqs"], p["context_len"]) for p in dec}
    ds = sorted({d for d, _ in have})
    ls = sorted({c for _, c in have})
    want = {b for b in buckets if ds[0] < b < ds[-1]}
    if firsts:
        want |= {x for lo, hi in pairwise(buckets) for x in (lo + 1, lo + 2) if x < hi and ds[0] < x <= ds[-1]}
    med = live_decode_medians(steps_path, dec_path)
    print(f"what-if decode points for {prof_path} (live medians from {steps_path})")
    print(f"{'d':>4} {'ref':>4} {'live d':>8} {'live ref':>9} {'n':>5} {'ratio':>7}   points (L: ms)")
    added = []
    for d in sorted(want):
        if all((d, L) in have for L in ls):
            continue
        ref = max(x for x in ds if x < d)
        if d not in med or ref not in med:
            print(f"{d:>4}: no live steps at d or at {ref}; skipped")
            continue
        ratio = med[d][0] / med[ref][0]
        row = []
        for L in ls:
            if (d, L) in have:
                continue
            base = next(p for p in dec if p["num_decode_seqs"] == ref and p["context_len"] == L)
            launch = base.get("launch_ms_median", 0.0)
            ms = (base["step_ms"] - launch) * ratio + launch
            pt = {**base, "num_decode_seqs": d, "num_context_tokens": d * L, "step_ms": ms,
                  "step_ms_median": ms, "step_ms_min": ms, "whatif_from": {"d": ref, "live_ratio": ratio}}
            added.append(pt)
            row.append(f"{L}: {ms:.3f}")
        print(f"{d:>4} {ref:>4} {med[d][0]:>8.3f} {med[ref][0]:>9.3f} {med[d][1]:>5} {ratio:>7.4f}   " + ", ".join(row))
    new["points"] = doc["points"] + added
    new["whatif"] = ("issue 35 s15: decode points at the graph buckets' first batches stood in from live step "
                     "ratios (bench/results/fidelity_cost_s15/whatif_decode_buckets.py); not measured")
    Path(out).write_text(json.dumps(new, indent=1) + "\n")
    print(f"wrote {out}: {len(added)} stand-in points")


if __name__ == "__main__":
    main(sys.argv[1:])
