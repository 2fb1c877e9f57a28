"""Issue 35, session 32: the same-machine decode check read by which profile pass priced each step.

`scripts/gpu_decode_same_machine.sh` replayed 700 live steps on the card that ran them and profiled them.
`decode_replay_read.py` splits the decode-only steps by d on a power of 2 or not. This splits them by the weight
the raw model's charge takes from points of the profile's *bucket pass* (`decode_bucket_shapes`, measured one
decode shape after another at the end of the profile) against its *grid pass* (the grid's decode points, each
measured right after the grid's paused mixed points). Inside a decode-graph bucket (lo, hi] the model
interpolates between its measured batches lo + 1, lo + 2 (bucket pass) and hi (grid pass where hi is a grid d,
else bucket pass), never across a bucket's edge (`sims.profile_cost`). So w(d) = 1 at lo + 1 and lo + 2, falls
linearly to 0 at hi where hi is a grid point, and stays 1 in a bucket whose every point is the bucket pass's.

If the bucket pass reads its points low by a fraction e and the grid pass reads right, every replay reads
raw x (1 + e w(d)): the fit of e, and what is left once it is taken out, say whether that is all.

    python bench/results/decode_same_machine_s32/read_by_pass.py DIR   (DIR: compositions.json, replay_*.json,
                                                                        the part's profile_*.json)
    python bench/results/decode_same_machine_s32/read_by_pass.py PROFILE.json DECODE_EXACT.txt   (a grid part:
        the live steps' live / model by d, `decode_exact.py`'s output, read_part.sh's read/decode_exact.txt)
"""
import json
import sys
from pathlib import Path

import numpy as np


def weights(profile: dict) -> dict[int, float]:
    """w(d) for every d up to the largest decode bucket the grid reaches."""
    pts = profile["points"]
    dec = {q["num_decode_seqs"] for q in pts if q["num_prefill_tokens"] == 0 and q["num_decode_seqs"]
           and "decode_context_lens" not in q}
    grid_ds = {1, 2, 4, 8, 16, 32, 64, 128} & dec  # the grid pass's decode batches (the validate's grid)
    buckets = sorted(profile["cuda_graph_decode_buckets"])
    w = {}
    lo = 0
    for hi in buckets:
        measured = sorted(d for d in dec if lo < d <= hi)
        for d in range(lo + 1, hi + 1):
            if d in grid_ds:
                w[d] = 0.0
            elif d in measured:
                w[d] = 1.0
            else:  # between the nearest measured batches below and above
                below = max((x for x in measured if x < d), default=None)
                above = min((x for x in measured if x > d), default=None)
                if below is None or above is None:
                    w[d] = np.nan
                    continue
                wb = 0.0 if below in grid_ds else 1.0
                wa = 0.0 if above in grid_ds else 1.0
                f = (d - below) / (above - below)
                w[d] = wb * (1 - f) + wa * f
        lo = hi
    return w


def fit(name: str, d: np.ndarray, n: np.ndarray, y: np.ndarray, w: dict[int, float]) -> None:
    """Print the steps-weighted fit y = c + e w(d) and its rms residual against the mean alone."""
    wd = np.array([w.get(int(x), np.nan) for x in d])
    ok = np.isfinite(wd) & np.isfinite(y)
    X = np.stack([np.ones(ok.sum()), wd[ok]], 1)
    W = np.sqrt(n[ok])
    coef, *_ = np.linalg.lstsq(X * W[:, None], y[ok] * W, rcond=None)
    res = y[ok] - X @ coef
    rms = float(np.sqrt(np.average(res ** 2, weights=n[ok])))
    rms0 = float(np.sqrt(np.average((y[ok] - np.average(y[ok], weights=n[ok])) ** 2, weights=n[ok])))
    print(f"  {name:11s} c {coef[0]:.4f}  e {coef[1]:+.4f}   rms residual {rms:.4f} (about the mean alone: "
          f"{rms0:.4f})")


def main_part(profile: Path, exact: Path, d_max: int = 64) -> None:
    """A grid part: `decode_exact.py`'s live / model by d (d <= d_max) fitted the same way."""
    w = weights(json.loads(profile.read_text()))
    rows = []
    for line in exact.read_text().splitlines():
        f = line.split()
        if len(f) >= 6 and f[0] == "d" and f[2] == "n" and f[4] == "live/model" and int(f[1]) <= d_max:
            rows.append((int(f[1]), int(f[3]), float(f[5])))
    if not rows:
        raise SystemExit(f"no 'd N n N live/model R' line in {exact}")
    a = np.array(rows, dtype=float)
    print(f"{profile.name}: live decode-only / model by d (d <= {d_max}), fitted c + e w(d):")
    print("   d     n   w(d)  live/model")
    for d, n, y in rows:
        print(f"{d:4d} {n:5d}  {w.get(d, np.nan):5.2f}  {y:10.4f}")
    fit("live", a[:, 0], a[:, 1], a[:, 2], w)


def main(root: Path) -> None:
    comps = {s["i"]: s for s in json.loads((root / "compositions.json").read_text())["steps"]}
    prof = json.loads(next(root.glob("*/profile_*.json")).read_text())
    w = weights(prof)
    reps = {p.stem.removeprefix("replay_"): json.loads(p.read_text()) for p in sorted(root.glob("replay_*.json"))}
    base = reps["zeros"]
    rows = {}
    for r in base["steps"]:
        s = comps[r["i"]]
        if s["p"] or s["idle_before"]:
            continue
        rows.setdefault(s["d"], []).append(r["i"])
    cols = [("live", lambda i, r: comps[i]["live_device_ms"]),
            ("paused", lambda i, r: r["zeros"].get("paused_ms", np.nan)),
            ("pipe_zeros", lambda i, r: r["zeros"]["pipelined_ms"]),
            ("pipe_fill", lambda i, r: r["fill"]["pipelined_ms"]),
            ("pipe_zeros2", lambda i, r: r["zeros2"]["pipelined_ms"])]
    by_i = {k: {x["i"]: x for x in v["steps"]} for k, v in reps.items()}
    table = []
    print(f"{base.get('device_name')}: decode-only steps by d, each column's time / the raw model's charge")
    print("   d    n   w(d)  " + "  ".join(f"{c:>11s}" for c, _ in cols))
    for d in sorted(rows):
        ids = rows[d]
        raw = sum(comps[i]["raw_model_ms"] for i in ids)
        vals = [sum(f(i, {k: by_i[k][i] for k in by_i}) for i in ids) / raw for _, f in cols]
        table.append((d, len(ids), w.get(d, np.nan), *vals))
        print(f"{d:4d} {len(ids):4d}  {w.get(d, np.nan):5.2f}  " + "  ".join(f"{v:11.4f}" for v in vals))
    a = np.array(table, dtype=float)
    print("\nfit of ratio = c + e w(d), weighted by steps (c: the level at grid-pass points, e: the bucket pass's "
          "shortfall):")
    for j, (name, _) in enumerate(cols):
        fit(name, a[:, 0], a[:, 1], a[:, 3 + j], w)

if __name__ == "__main__":
    if len(sys.argv) == 2:
        main(Path(sys.argv[1]))
    elif len(sys.argv) == 3:
        main_part(Path(sys.argv[1]), Path(sys.argv[2]))
    else:
        sys.exit(__doc__)
