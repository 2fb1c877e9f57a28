"""Issue 35, session 36: prediction 20 on a profile with the pairs' next twin. Per kind and d, the whole tile the
next twin measures (`whole_ms_median`, next - on, per 64-token tile) beside the fit's linear context cost over the
same tile (`coef` e a context token x 64 x d), their ratio, and the fractions read against each.

    python bench/results/pairs_s36/whole_vs_fit.py PROFILE_JSON
"""
import json
import sys
from pathlib import Path

from sims.profile_cost import ProfileCost


def main() -> None:
    path = sys.argv[1]
    doc = json.loads(Path(path).read_text())
    measured = ProfileCost.from_json(path)
    e_s = float(measured.coef[3])  # s a context token (_FEATURE_NAMES[3])
    print(f"{path}: fit e = {e_s * 1e9:.2f} ns a context token; pooled fractions (whole measured) "
          f"{measured.tile_fractions}")
    print("kind    d   off-on ms  whole meas ms  whole fit ms  meas/fit  fraction(meas)  fraction(fit)")
    sums = {}
    for r in measured.tile_edge_points:
        d, bn = r["num_decode_seqs"], r["block_n"]
        fit = e_s * bn * d * 1e3
        meas = r["whole_tile_ms"]
        part = r["diff_ms"] - e_s * d * 1e3  # less the one token's own cost, as set_tile_pairs reads it
        s = sums.setdefault(r["kind"], [0.0, 0.0, 0.0])
        s[0] += part
        s[1] += meas
        s[2] += fit
        print(f"{r['kind']:7s} {d:3d}  {r['diff_ms']:9.4f}  {meas:13.4f}  {fit:12.4f}  {meas / fit:8.2f}  "
              f"{r['tile_fraction']:14.2f}  {part / fit:13.2f}")
    for k, (p, m, f) in sums.items():
        print(f"pooled {k}: whole measured / fit {m / f:.2f}; fraction against measured {p / m:.2f}, against fit "
              f"{p / f:.2f}")
    clocks = sorted({p.get("sm_clock_mhz") for p in doc.get("tile_edge_pairs") or []}, key=str)
    print("the pairs' SM clocks (MHz):", clocks)


if __name__ == "__main__":
    main()
