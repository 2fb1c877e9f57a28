"""Issue 35, session 34: the mixed-spread check against the cost model, tiles off and on.

The check (`../conditioned_s33/mixed_spread_check.py`) timed, on one H100, each composition of decodes (`equal`,
`uniform`, `edges`, `off_edge`, `one_long`) beside one 256-token chunk at start 0 (mixed) and alone (decode-only),
paused, as a ratio over `equal`. This charges the same compositions with a part's profile from the same warm
machine (`h100_6.7b/6.7b`, profiled minutes before the bf16 check), as the event loop charges them
(`fidelity_steps.model_step_ms`'s context: the decodes' contexts, times the mixed multiple beside a chunk or the
decode spread multiple alone, plus the chunk's), and prints measured / model-off / model-on ratios over `equal`.

    python bench/results/tiles_s34/spread_vs_model.py PART_DIR CHECK_JSON [--fractions]
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_spread_s19"))
sys.path.insert(0, str(ROOT / "bench/results/conditioned_s33"))
from mixed_spread_check import contexts
from spread_bins import build

KINDS = ("uniform", "edges", "off_edge", "one_long")


def charge(cost, ctxs: list[int], chunk: int) -> float:
    """The model's step time (ms) for these decodes beside one chunk at start 0 (chunk 0: decode-only)."""
    d, ctx = len(ctxs), sum(ctxs)
    if chunk:
        if getattr(cost, "charges_mixed_spread", False):
            ctx += int(ctx * (cost.mixed_context_multiple(ctxs) - 1.0))
        return 1e3 * cost.step_time(d, chunk, ctx + chunk, [(chunk, 0)])
    if getattr(cost, "charges_decode_spread", False):
        ctx = int(ctx * cost.decode_context_multiple(ctxs))
    return 1e3 * cost.step_time(d, 0, ctx, None)


def main(part: Path, check: Path) -> None:
    res = json.loads(check.read_text())
    lo, hi, chunk = res["lo"], res["hi"], res["chunk"]
    meas = {(r["mixed"], r["d"], r["kind"]): r["over_equal"] for r in res["rows"]}
    cost, _terms = build(part, "measured")
    print(f"part {part.name}, check {check.name} ({res['device_name']}, {res['quantization']} weights)")
    print("ratios over `equal`, each cell measured / model tiles off / model tiles on")
    for mixed in (True, False):
        print("mixed (chunk at 0)" if mixed else "decode-only")
        for d in res["ds"]:
            cells = []
            for kind in KINDS:
                mod = []
                for on in (False, True):
                    cost.mixed_tiles = on
                    cost._memo.clear()
                    cost._mixed_memo.clear()
                    ch = chunk if mixed else 0
                    mod.append(charge(cost, contexts(kind, d, lo, hi), ch)
                               / charge(cost, contexts("equal", d, lo, hi), ch))
                cells.append(f"{kind} {meas[(mixed, d, kind)]:.4f}/{mod[0]:.4f}/{mod[1]:.4f}")
            print(f"  d {d:3d}  " + "  ".join(cells))


if __name__ == "__main__" and len(sys.argv) == 3:
    main(Path(sys.argv[1]), Path(sys.argv[2]))


def fractions(part: Path, check: Path) -> None:
    """The fraction of a whole tile the check's `off_edge` rows cost, read as the profile's off-edge points are
    (`ProfileCost.set_tile_edges`): each row's time taken as its measured ratio times the model's time for
    `equal`, the context at which the model gives it, over the decodes' tokens to their tile ends."""
    res = json.loads(check.read_text())
    lo, hi, chunk = res["lo"], res["hi"], res["chunk"]
    meas = {(r["mixed"], r["d"], r["kind"]): r["over_equal"] for r in res["rows"]}
    cost, _terms = build(part, "measured")
    pts = []
    for mixed in (True, False):
        for d in res["ds"]:
            ctxs = contexts("off_edge", d, lo, hi)
            t = charge(cost, contexts("equal", d, lo, hi), chunk if mixed else 0) * meas[(mixed, d, "off_edge")]
            pts.append({"num_decode_seqs": d, "num_prefill_tokens": chunk if mixed else 0,
                        "num_prefill_seqs": 1 if mixed else 0, "prefill_context_len": 0,
                        "decode_context_lens": [[d, ctxs[0]]], "step_ms": t,
                        **({"device_ms_median": t} if cost.fits_device_time else {})})
    cost.hides_launch = False  # the times above are the model's own: read back as they were charged
    cost.set_tile_edges(pts)
    print("fraction of a whole tile one token past an edge costs (as the profile's off-edge points would read):")
    for kind in ("mixed", "decode"):
        row = [f"d {e['num_decode_seqs']} {e['tile_fraction']:.2f}" for e in cost.tile_edge_points if e["kind"] == kind]
        print(f"  {kind:6s} {', '.join(row)}  (median {cost.tile_fractions.get(kind, float('nan')):.2f})")


if __name__ == "__main__" and len(sys.argv) > 3 and sys.argv[3] == "--fractions":
    fractions(Path(sys.argv[1]), Path(sys.argv[2]))
