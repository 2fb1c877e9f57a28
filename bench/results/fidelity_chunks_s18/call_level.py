"""Issue 35, session 18 (H35C): is the bias of the steps with prefill the call's level or a shape?

1. Two calls of one model on one grid (33B bf16: s11 and s13; 6.7B bf16: s14 and s16): the same step
   shapes side by side, in the profiles (their common points, step minus launch as the model fits
   them) and in the live step logs (median live ms of the single-chunk 256-token steps by chunk
   position, decodes beside it in 8s, and load; decode-only steps by decode count in 8s). If the
   live ratio between the calls exceeds the profiles' ratio, the difference is a level of the call
   that its profile, measured paused before the live runs, did not see.
2. Within each call, log(model / live) of the steps with prefill regressed on the candidates jointly
   (chunk_bins.py has them one at a time): a later chunk (start > 0), right after a step with
   prefill, the model's prefill-busy share f before it (the power cap's input), decodes / 64, more
   than one chunk. A coefficient of the same sign in every call of a model is a shape the model
   misses; the constant, the call's level.
3. The live steps' own scatter: log(live ms) within groups of one exact shape (one 256-token chunk,
   its start, the exact decode count, the step before it a prefill step or not, one load), pooled sd
   over the groups of >= 5 steps, beside the model's per-step error in the same groups: the part of
   the model's scatter no function of the step's shape can remove (level_bound.py --scatter: the
   same chunks at 0.95x against an iid scatter of that size).
4. The model's mean error split in two: the bare profile (`ProfileCost.step_time` at the step's
   shape) against live, and the power cap's factor (the model's time / the bare one: the pause
   check's term, `fidelity_steps.model_step_ms`), by kind at 0.5x and 0.95x.

    python call_level.py > call_level.txt
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from chunk_bins import LOADS, PARTS, part_steps

PAIRS = (("33b-s11", "33b-s13"), ("6.7b-s14", "6.7b-s16"))


def profile_points(part: Path) -> dict:
    doc = json.loads((part / f"profile_{part.name}.json").read_text())
    return {(x["num_decode_seqs"], x["num_prefill_tokens"], x.get("num_prefill_seqs", 1), x.get("prefill_context_len", 0),
             x["context_len"]): x["step_ms_median"] - x.get("launch_ms_median", 0.0) for x in doc["points"]}


def live_shapes(steps: list[dict]) -> dict:
    """(kind, load, decodes in 8s) -> live ms of the steps of that shape (after a step, not idle)."""
    out: dict = {}
    for s in steps:
        if s["lr"] is None or s["since_prefill"] is None or s["load"] not in LOADS:
            continue
        if s["p"] == 256 and len(s["chunks"]) == 1:
            kind = "256 chunk, first" if s["chunks"][0][1] == 0 else "256 chunk, later"
        elif not s["p"]:
            kind = "decode-only"
        else:
            continue
        out.setdefault((kind, s["load"], s["d"] // 8 * 8), []).append(s["ms"])
    return out


def compare_calls(a: str, b: str, data: dict) -> None:
    pa, pb = profile_points(PARTS[a]), profile_points(PARTS[b])
    common = sorted(set(pa) & set(pb))
    r_pre = [np.log(pb[k] / pa[k]) for k in common if k[1]]
    r_dec = [np.log(pb[k] / pa[k]) for k in common if not k[1]]
    print(f"\n## {b} against {a}")
    print(f"profiles, common points, log({b} / {a}) of step - launch: with prefill {100 * np.mean(r_pre):+.2f}% "
          f"(sd {100 * np.std(r_pre):.2f}, n {len(r_pre)}), decode-only {100 * np.mean(r_dec):+.2f}% "
          f"(sd {100 * np.std(r_dec):.2f}, n {len(r_dec)})")
    la, lb = live_shapes(data[a]), live_shapes(data[b])
    print(f"live, same shapes (>= 10 steps each side), log of the median live ms {b} / {a}:")
    print(f"  {'kind':18s} {'load':6s} {'shapes':>6s} {'mean %':>7s} {'min':>6s} {'max':>6s} {'steps':>7s}")
    summary = {}
    for kind in ("decode-only", "256 chunk, first", "256 chunk, later"):
        for load in LOADS:
            r, n = [], 0
            for key in sorted(set(la) & set(lb)):
                if key[0] != kind or key[1] != load or min(len(la[key]), len(lb[key])) < 10:
                    continue
                r.append(np.log(np.median(lb[key]) / np.median(la[key])))
                n += len(la[key]) + len(lb[key])
            if r:
                summary.setdefault(kind, []).extend(r)
                print(f"  {kind:18s} {load:6s} {len(r):6d} {100 * np.mean(r):+7.2f} {100 * min(r):+6.2f} "
                      f"{100 * max(r):+6.2f} {n:7d}")
    for kind, r in summary.items():
        print(f"  {kind:18s} {'all':6s} {len(r):6d} {100 * np.mean(r):+7.2f} (live)  against the profiles' "
              f"{100 * np.mean(r_dec if kind == 'decode-only' else r_pre):+.2f}")


def regress(name: str, steps: list[dict]) -> None:
    names = ("const", "later chunk", "after prefill", "busy share f", "d / 64", "k > 1")
    X, y, L = [], [], []
    for s in steps:
        if s["lr"] is None or not s["p"] or s["since_prefill"] is None or s["load"] not in LOADS:
            continue
        X.append([1.0, float(any(st > 0 for _, st in s["chunks"])), float(s["since_prefill"] == 0),
                  s["f"], s["d"] / 64, float(len(s["chunks"]) > 1)])
        y.append(s["lr"])
        L.append(s["load"])
    X, y = np.array(X), np.array(y)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    res = y - X @ coef
    se = np.sqrt(np.diag(np.linalg.inv(X.T @ X)) * res.var())
    L = np.array(L)
    # the call's level at each load: the mean of the steps with prefill there (the replay's drift)
    lv = " ".join(f"{ld} {100 * y[L == ld].mean():+.2f}" for ld in LOADS)
    print(f"{name:9s} n {len(y):5d} " + "  ".join(f"{n_} {100 * c:+6.2f}±{100 * e:.2f}" for n_, c, e in
                                                   zip(names, coef, se))
          + f"  resid sd {100 * res.std():.2f}   mean by load: {lv}")


def live_scatter(name: str, steps: list[dict]) -> None:
    groups: dict = {}
    for s in steps:
        if (s["lr"] is None or s["p"] != 256 or len(s["chunks"]) != 1 or s["since_prefill"] is None
                or s["load"] not in LOADS):
            continue
        key = (s["load"], s["d"], s["chunks"][0][1] > 0, s["since_prefill"] == 0)
        groups.setdefault(key, []).append((np.log(s["ms"]), s["lr"]))
    for load in LOADS + ("all",):
        dl, dm, n, g = [], [], 0, 0
        for key, v in groups.items():
            if len(v) < 5 or (load != "all" and key[0] != load):
                continue
            a = np.array(v)
            dl.extend(a[:, 0] - a[:, 0].mean())
            dm.extend(a[:, 1] - a[:, 1].mean())
            n += len(v)
            g += 1
        if n:
            print(f"{name:9s} {load:5s} groups {g:4d} steps {n:5d}: live sd within a shape {100 * np.std(dl):.2f}%, "
                  f"model error sd within a shape {100 * np.std(dm):.2f}%")


def split(name: str, steps: list[dict], cost) -> None:
    cap = cost.describe()["power_cap"] or {}
    print(f"{name:9s} the cap from the pause check: r {cap.get('back_to_back', 1.0):.4f} (fully busy), f_ref "
          f"{cap.get('f_ref', 0.0):.3f}, tau {cap.get('tau_s')}, window {cap.get('window_s')} s")
    for kind, sel in (("with prefill", lambda s: s["p"]), ("decode-only", lambda s: not s["p"])):
        for load in ("0.5x", "0.95x"):
            b, c, m = [], [], []
            for s in steps:
                if s["lr"] is None or s["since_prefill"] is None or s["load"] != load or not sel(s):
                    continue
                ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
                bare = 1e3 * cost.step_time(s["d"], s["p"], ctx, s["chunks"] or None)
                b.append(np.log(bare / s["ms"]))
                c.append(np.log(s["model_ms"] / bare))
                m.append(s["lr"])
            print(f"{name:9s} {kind:13s} {load:5s} n {len(b):5d}: bare / live {100 * np.mean(b):+6.2f}%  cap factor "
                  f"{100 * np.mean(c):+5.2f}%  model / live {100 * np.mean(m):+6.2f}%")


def main() -> int:
    built = {n: part_steps(p) for n, p in PARTS.items()}
    data = {n: v[0] for n, v in built.items()}
    print("# 1. two calls of one model, the same shapes")
    for a, b in PAIRS:
        compare_calls(a, b, data)
    print("\n# 2. log(model / live) of the steps with prefill (after a step), regressed per call, "
          "coefficients in % (± se)")
    for n, steps in data.items():
        regress(n, steps)
    print("\n# 3. the live steps' own scatter at one exact shape (256-token chunk steps)")
    for n, steps in data.items():
        live_scatter(n, steps)
    print("\n# 4. mean log(model / live) split: the bare profile and the power cap's factor (after a step, not idle)")
    for n, (steps, cost, _val) in built.items():
        split(n, steps, cost)
    return 0


if __name__ == "__main__":
    sys.exit(main())
