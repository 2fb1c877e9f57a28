"""Issue 35, session 21 (for the next calls): a profile's `block_order_check` (decode points at d 16 /
64 / 128 in each KV block order, `bench.engine.profile.decode_tables`) read as each order's time over
the contiguous one's, beside what the live decode-only steps of the part read over the contiguous
profile (decode_vs_profile.py). Predicted on the H100's 6.7B where the layout is the excess:
interleaved / contiguous ~1.01 at d 16, ~1.015-1.02 at 64 and 128; where it is not: 1.00 +- 0.005 at
every d, and the excess is elsewhere: "contiguous+filled" (the contexts prefilled by the model, the
K/V a live decode reads, against the zeroed pool) tells whether it is what the blocks hold (their
power, at the H100's 567-670 W decode draw: 1,965 MHz live against 1,980 in the points).
The H200's 33B int4-fp8 read ~1.00 to d 32 live at near-equal contexts: predicted 1.00 +- 0.005 there.
Run from the repo root:  python block_order_read.py PROFILE.json"""
import json
import sys
from pathlib import Path


def main(path: str) -> int:
    doc = json.loads(Path(path).read_text())
    check = doc.get("block_order_check")
    if not check:
        print(f"{path}: no block_order_check (profiles since session 21 have it)")
        return 1
    print(f"{path}: points laid out {doc.get('kv_block_order', 'contiguous')}")
    by = {(r["num_decode_seqs"], r["block_order"] + ("" if r.get("kv_content", "zeros") == "zeros" else "+filled")): r
          for r in check}
    for d in sorted({r["num_decode_seqs"] for r in check}):
        base = by.get((d, "contiguous"))
        if base is None:
            continue
        line = f"  d {d:4d} c {base['context_len']}:"
        for order in ("interleaved", "scattered", "contiguous+filled"):
            r = by.get((d, order))
            if r is None:
                continue
            key = "device_ms_median" if "device_ms_median" in r and "device_ms_median" in base else "step_ms_median"
            line += f"  {order} / contiguous {r[key] / base[key]:.4f} ({key.split('_')[0]})"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
