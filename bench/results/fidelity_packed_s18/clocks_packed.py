"""Issue 35, session 18 (H35P): the SM clock and board power at the nvidia-smi samples (every ~100 ms)
that fall inside the live steps, by step kind: the ~2,000-token packed prefill steps (> 1,024 prefill
tokens) against the capped mixed steps (one 256-token chunk beside decodes) and decode-only steps.
What the pause check's "sustained_packed" run should settle near (its clock), for a part.

    python clocks_packed.py PART_DIR
"""
import datetime
import gzip
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import read_steps


def smi(path):
    out = []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            if line.startswith("#") or not line.strip():
                continue
            ts, sm, _mem, pw, _temp, reasons = (x.strip() for x in line.split(","))
            t = datetime.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
            out.append((t.timestamp(), int(sm), float(pw), int(reasons, 16)))
    return np.array(out)


def main(part):
    R = Path(part)
    tag = R.name
    rows = read_steps(R / f"steps_{tag}.jsonl.gz")
    s = smi(R / f"smi_{tag}.csv.gz")
    # the step log (backend/server/step_log.py): "mono" starts the step's window on the monotonic
    # clock (from the later of its launch and the previous read-back to its own read-back, "ms"
    # long), "t" is its launch on the wall clock. wall - mono is one offset; a step launched after
    # the previous read-back has t - mono equal to it, any other less: the offset is the largest
    kinds = {"packed (> 1,024 prefill tokens)": [], "mixed (one 256-token chunk)": [], "decode-only": []}
    offset = max(r["t"] - r["mono"] for r in rows)
    starts = np.array([r["mono"] for r in rows]) + offset
    ends = starts + np.array([r["ms"] for r in rows]) / 1e3
    for t, sm, pw, reasons in s:
        i = int(np.searchsorted(ends, t))
        if i >= len(rows) or starts[i] > t:
            continue
        r = rows[i]
        p, nch = r["prefill_tokens"], r["prefill_chunks"]
        key = ("packed (> 1,024 prefill tokens)" if p > 1024 else
               "mixed (one 256-token chunk)" if p == 256 and nch == 1 and r["decodes"] else
               "decode-only" if not p else None)
        if key:
            kinds[key].append((sm, pw, bool(int(reasons) & 0x4)))
    print(f"== {tag}: nvidia-smi samples inside live steps, by the step's kind")
    for key, v in kinds.items():
        if not v:
            print(f"  {key:34s}    0")
            continue
        a = np.array(v, dtype=float)
        print(f"  {key:34s} {len(a):4d}  SM clock median {np.median(a[:, 0]):6.0f} MHz (p10 {np.percentile(a[:, 0], 10):5.0f}, "
              f"p90 {np.percentile(a[:, 0], 90):5.0f}), power median {np.median(a[:, 1]):5.0f} W, SW power cap {a[:, 2].mean():.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
