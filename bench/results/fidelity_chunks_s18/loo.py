"""Issue 35, session 18 (H35C): candidate (6), the model between and past the profile's points,
checked against the profile's own points (no live data: what the profile alone can tell).

1. Leave one out: every point with prefill tokens dropped in turn, the model refitted on the rest
   (`ProfileCost`, hide_launch as the replays build it; the power cap is a factor on top and left
   out) and charged at the dropped point's shape; log(model / measured step - launch), by p and d.
   A held-out point at a grid corner is extrapolated: "inside" says whether the rest of the grid
   has points of the same p on both sides in d.
2. The 33B bf16 grids (s11, s13) measured prefill chunks of 512, 1,024 and 2,048 tokens only, while
   the live steps with prefill are 256-token chunks (chunk_bins.txt, (6)): the model charges them
   by extrapolation. The 6.7B s14 / s16 grids measured 64 and 256 too; with those points dropped
   (the 33B's grid) the model's charge at the 256-token points against their measurement is the
   size of that extrapolation's error on a grid where it can be checked; the 33B FP8 grids (s16, s17:
   the same architecture, another GEMM path) alike.

    python loo.py > loo.txt
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from sims.profile_cost import ProfileCost

R = HERE.parent
PROFILES = {
    "33b-s11": R / "fidelity_grid_h200_s11/33b/profile_33b.json",
    "33b-s13": R / "fidelity_grid_h200_s13/33b-seeds/profile_33b-seeds.json",
    "6.7b-s13": R / "fidelity_grid_h200_s13/6.7b/profile_6.7b.json",
    "6.7b-s14": R / "fidelity_grid_h200_s14/6.7b/profile_6.7b.json",
    "6.7b-s16": R / "fidelity_grid_h200_s16/6.7b/profile_6.7b.json",
}
CUT = {"6.7b-s14": PROFILES["6.7b-s14"], "6.7b-s16": PROFILES["6.7b-s16"],
       "33b-fp8-s16": R / "fidelity_grid_h200_s16/33b-fp8/profile_33b-fp8.json",
       "33b-fp8-s17": R / "fidelity_grid_h200_s17/33b-fp8/profile_33b-fp8.json"}


def fit(doc: dict, keep: list[int]) -> ProfileCost:
    pts = [doc["points"][i] for i in keep]
    meta = {k: v for k, v in doc.items() if k not in ("points", "pause_check")}
    arr = np.array([(x["num_decode_seqs"], x["num_prefill_tokens"], x["num_context_tokens"],
                     x.get("num_prefill_seqs", 1) if x["num_prefill_tokens"] else 0,
                     x.get("prefill_context_len", 0)) for x in pts], dtype=float)
    return ProfileCost(arr, np.array([x["step_ms_median"] for x in pts]) / 1e3,
                       launch_times_s=np.array([x["launch_ms_median"] for x in pts]) / 1e3, hide_launch=True,
                       token_buckets=doc.get("cuda_graph_token_buckets"), meta=meta)


def charge(cost: ProfileCost, x: dict) -> float:
    k = max(1, x.get("num_prefill_seqs", 1))
    s = x.get("prefill_context_len", 0)
    n = x["num_prefill_tokens"] // k
    return cost.step_time(x["num_decode_seqs"], x["num_prefill_tokens"], x["num_context_tokens"],
                          [(n, s)] * k)


def measured(x: dict) -> float:
    return (x["step_ms_median"] - x["launch_ms_median"]) / 1e3


def inside(doc: dict, i: int) -> bool:
    x = doc["points"][i]
    same = [y["num_decode_seqs"] for j, y in enumerate(doc["points"]) if j != i
            and y["num_prefill_tokens"] == x["num_prefill_tokens"]
            and y.get("num_prefill_seqs", 1) == x.get("num_prefill_seqs", 1)
            and y.get("prefill_context_len", 0) == x.get("prefill_context_len", 0)]
    return bool(same) and min(same) < x["num_decode_seqs"] < max(same)


def main() -> int:
    print("# 1. leave one out, points with prefill: log(model / measured) in %")
    for name, path in PROFILES.items():
        doc = json.loads(path.read_text())
        n = len(doc["points"])
        rows = []
        for i, x in enumerate(doc["points"]):
            if not x["num_prefill_tokens"]:
                continue
            cost = fit(doc, [j for j in range(n) if j != i])
            rows.append((x, 100 * np.log(charge(cost, x) / measured(x)), inside(doc, i)))
        print(f"\n## {name}: {n} points, {len(rows)} with prefill")
        for label, sel in (("all", lambda r: True), ("inside the grid in d", lambda r: r[2]),
                           ("a grid edge in d", lambda r: not r[2])):
            e = [r[1] for r in rows if sel(r)]
            if e:
                print(f"  {label:24s} n {len(e):3d} mean {np.mean(e):+6.2f} sd {np.std(e):5.2f} "
                      f"mean |e| {np.mean(np.abs(e)):5.2f}")
        by_p: dict = {}
        for x, e, ins in rows:
            key = (x["num_prefill_tokens"], x.get("num_prefill_seqs", 1), x.get("prefill_context_len", 0))
            by_p.setdefault(key, []).append((x["num_decode_seqs"], e, ins))
        for key in sorted(by_p):
            v = by_p[key]
            print(f"  p {key[0]:5d} k {key[1]} s {key[2]:3d}: mean {np.mean([e for _, e, _ in v]):+6.2f}  "
                  + " ".join(f"d{d}{'' if ins else '*'} {e:+.1f}" for d, e, ins in sorted(v, key=lambda t: t[0])))
    print("\n  (* a grid edge in d: extrapolated)")
    print("\n# 2. the grids with their 64- and 256-token points dropped (the 33B bf16 grid): the model at "
          "the 256-token points against their measurement, log(model / measured) in %")
    for name, path in CUT.items():
        doc = json.loads(path.read_text())
        keep = [j for j, x in enumerate(doc["points"]) if x["num_prefill_tokens"] not in (64, 256)]
        full = fit(doc, list(range(len(doc["points"]))))
        cut = fit(doc, keep)
        tgt = [x for x in doc["points"] if x["num_prefill_tokens"] == 256]
        e_cut = [100 * np.log(charge(cut, x) / measured(x)) for x in tgt]
        e_full = [100 * np.log(charge(full, x) / measured(x)) for x in tgt]
        print(f"  {name}: n {len(tgt)}; without the 64/256 points mean {np.mean(e_cut):+.2f} sd {np.std(e_cut):.2f} "
              f"(by d: " + " ".join(f"{x['num_decode_seqs']}/{x.get('num_prefill_seqs', 1)}/{x.get('prefill_context_len', 0)} "
                                    f"{e:+.1f}" for x, e in zip(tgt, e_cut)) + ")")
        print(f"  {' ' * len(name)}  the full grid (fits them): mean {np.mean(e_full):+.2f} sd {np.std(e_full):.2f}")
    print("\n# 3. the pause check's step paused twice in one profile: log(paused_again / paused) of the medians, %")
    for path in sorted(R.glob("fidelity_grid_h200_s1*/*/profile_*.json")):
        if not (path.parent / f"validate_{path.parent.name}.json").exists():
            continue  # what-if / surrogate profiles of the analysis folders: not measured
        doc = json.loads(path.read_text())
        runs = {r["run"]: r for r in (doc.get("pause_check") or {}).get("runs", [])}
        if "paused" in runs and "paused_again" in runs:
            a, b = runs["paused"]["step_ms_median"], runs["paused_again"]["step_ms_median"]
            print(f"  {path.relative_to(R)!s:60s} {a:8.3f} {b:8.3f} ms  {100 * np.log(b / a):+.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
