"""Issue 35, session 35: the fraction of a whole tile a partial one costs, read two ways on the same card.

The mixed-spread check (`../conditioned_s33/mixed_spread_check.py`: paused single steps, every decode at 576
(`equal`) and at 577 (`off_edge`), median of 5 seeds) and the profile's tile-edge pairs (512 / 513, 4 rounds in
turn, the grid's own harness) each give what one key past a tile edge costs, off - on. Over the whole tile each is
read against the profile fit's linear context cost (`coef` e a context token, as `ProfileCost.set_tile_pairs` reads
pairs without a next twin): per d and pooled over d (sum of excesses over sum of whole tiles), beside a chunk
("mixed") and alone ("decode"). Session 34's `spread_vs_model.py --fractions` read the check against the whole
fitted surface instead, whose slope between the grid's contexts is the grid points' noise.

    python bench/results/tiles_s35/check_vs_pairs.py CHECK_JSON PROFILE_JSON
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from sims.profile_cost import ProfileCost

TILE = 64


def main() -> None:
    check, prof = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2]
    e_ms = float(ProfileCost.from_json(prof).coef[3]) * 1e3  # ms a context token
    by = {(r["d"], r["kind"], r["mixed"]): r["ms"] for r in check["rows"]}
    pairs = json.loads(Path(prof).read_text()).get("tile_edge_pairs", [])
    print(f"check {check['device_name']} {check.get('quantization')}; profile {Path(prof).name}; "
          f"e {e_ms * 1e6:.1f} ns a context token (a whole {TILE}-token tile a decode: {e_ms * (TILE - 1) * 1e3:.2f} us)")
    for mixed in (True, False):
        kind = "mixed" if mixed else "decode"
        rows, sm, sw = [], 0.0, 0.0
        for d in check["ds"]:
            if (d, "off_edge", mixed) not in by:
                continue
            m = by[(d, "off_edge", mixed)] - by[(d, "equal", mixed)] - e_ms * d
            w = e_ms * d * (TILE - 1)
            rows.append(f"d {d} {m / w:.2f}")
            sm, sw = sm + m, sw + w
        line = f"  check {kind:6s} " + ", ".join(rows) + f"  (pooled {sm / sw:.2f})"
        rows, sm, sw = [], 0.0, 0.0
        for r in pairs:
            if bool(r["num_prefill_tokens"]) != mixed:
                continue
            d = r["num_decode_seqs"]
            m, w = r["diff_ms_median"] - e_ms * d, e_ms * d * (TILE - 1)
            rows.append(f"d {d} {m / w:.2f}")
            sm, sw = sm + m, sw + w
        print(line)
        if rows:
            print(f"  pairs {kind:6s} " + ", ".join(rows) + f"  (pooled {sm / sw:.2f})")


if __name__ == "__main__":
    main()
