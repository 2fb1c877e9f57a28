"""Issue 35, session 26: the H100 profile of prefix and split points (prefix_h100.json), read against the two
questions in PREDICTIONS.md. Run from the repo root:

    python bench/results/fidelity_prefix_s26/prefix_h100_read.py

1. Each chunk's increment over start 0 (device ms) at starts 256-2,048, and its ratio to what start 256
   extrapolates through the origin (the twins' line).
2. The cost model built as a grid profile would be (prefix points at start 256 only), its increment over start 0
   at the measured long starts against the measured one: out of sample, twins against the fitted form.
3. Two chunks of p/2 against one of p tokens, beside the same decodes.
"""
import json
import tempfile
from pathlib import Path

from sims.profile_cost import ProfileCost

HERE = Path(__file__).resolve().parent
STARTS = (256, 512, 1024, 1536, 2048)


def main() -> None:
    doc = json.loads((HERE / "prefix_h100.json").read_text())
    pts = [p for p in doc["points"] if not p.get("decode_context_lens")]
    idx = {(p["num_decode_seqs"], p["num_prefill_tokens"], p.get("num_prefill_seqs", 1),
            p.get("prefill_context_len", 0)): p for p in pts}

    def ms(p):
        return p["device_ms_median"]

    print(f"{doc['device_name']}, {doc['model']}; decode context 705 a sequence; device ms (paused {doc['pause_ms']} ms)")
    print("\n1. increment over start 0, ms, at starts", STARTS, "| ratio to start 256's line through 0")
    for d in (0, 1, 8, 16, 32):
        for p in (64, 128, 256):
            base = idx.get((d, p, 1, 0))
            if base is None or (d, p, 1, 256) not in idx:
                continue
            inc = [ms(idx[(d, p, 1, s)]) - ms(base) for s in STARTS]
            ratio = [x / (inc[0] * s / 256) for x, s in zip(inc, STARTS)]
            print(f"   d {d:3d} p {p:4d}  " + " ".join(f"{x:6.3f}" for x in inc) + "  | "
                  + " ".join(f"{x:5.2f}" for x in ratio))

    print("\n2. the model from a grid-like copy (prefix points at start 256 only): its increment over start 0 against the\n"
          "   measured one, model / measured, at each longer start (this small grid's points are coplanar, so the\n"
          "   model is its regression alone: the increments, not the levels, are what the prefix term sets)")
    grid = dict(doc, points=[p for p in doc["points"] if p.get("prefill_context_len", 0) in (0, 256)])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "grid.json"
        path.write_text(json.dumps(grid))
        models = {form: ProfileCost.from_json(path, hide_launch=True, prefix_term=form) for form in ("twins", "fit")}
    for form, cost in models.items():
        print(f"   {form}: {cost.describe()['prefix_term']}")
        for d in (8, 16, 32):
            row = []
            b = idx[(d, 256, 1, 0)]
            t0 = 1e3 * cost.step_time(d, 256, b["num_context_tokens"], [(256, 0)])
            for s in STARTS[1:]:
                q = idx[(d, 256, 1, s)]
                t = 1e3 * cost.step_time(d, 256, q["num_context_tokens"], [(256, s)])
                row.append((t - t0) / (ms(q) - ms(b)))
            print(f"      d {d:3d} p 256  starts {STARTS[1:]}: " + " ".join(f"{x:.3f}" for x in row))

    print("\n3. k = 2 chunks of p / 2 against one chunk of p, same decodes, ms")
    for d in (0, 8, 16, 32):
        for p in (128, 256):
            one, two = idx.get((d, p, 1, 0)), idx.get((d, p, 2, 0))
            if one and two:
                print(f"   d {d:3d} p {p:4d}: one {ms(one):7.3f}  two {ms(two):7.3f}  two - one {ms(two) - ms(one):+.3f}")


if __name__ == "__main__":
    main()
