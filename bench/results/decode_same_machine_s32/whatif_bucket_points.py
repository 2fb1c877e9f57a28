"""Issue 35, session 32 (a what-if, not a measurement): a profile's decode-only points that the grid pass did not
measure (the decode-bucket and spread points, timed one decode shape after another) scaled by 1 + E, E the bucket
pass's shortfall `read_by_pass.py` fitted on the same-machine check (0.018), written as a new profile beside a copy
of the part's logs, so `validate_replay` can price the part as a conditioned profile should.

    python bench/results/decode_same_machine_s32/whatif_bucket_points.py PART_DIR OUT_DIR [E]
"""
import json
import shutil
import sys
from pathlib import Path

GRID_DS = {1, 2, 4, 8, 16, 32, 64, 128}


def main(part: Path, out: Path, e: float = 0.018) -> None:
    name = part.name
    dst = out / name
    dst.mkdir(parents=True, exist_ok=True)
    for f in part.iterdir():
        if f.is_file() and not f.name.startswith("profile_"):
            shutil.copy2(f, dst / f.name)
    doc = json.loads((part / f"profile_{name}.json").read_text())
    n = 0
    for p in doc["points"]:
        if p["num_decode_seqs"] and not p["num_prefill_tokens"] and (
                p["num_decode_seqs"] not in GRID_DS or "decode_spread" in p):
            for k in ("step_ms", "step_ms_min", "step_ms_median", "device_ms_median", "device_ms_min"):
                if k in p:
                    p[k] *= 1 + e
            n += 1
    doc["whatif"] = f"{n} bucket-pass / spread decode points x {1 + e:.3f} (session 32)"
    (dst / f"profile_{name}.json").write_text(json.dumps(doc) + "\n")
    print(f"{n} points x {1 + e:.3f} -> {dst}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), *(float(sys.argv[3]),) if len(sys.argv) > 3 else ())
