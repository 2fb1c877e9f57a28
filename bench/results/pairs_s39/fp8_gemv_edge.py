"""The FP8 decode step at the GEMV / _scaled_mm switch, read from committed profiles (no GPU).

`backend.kernels.fp8_gemv.fp8_linear` runs a decode step's linears with the Triton GEMV while the step's
rows (its CUDA graph's bucket: 16, 24, 32, 48, ...) are <= FP8_GEMV_MAX_M (32), and with per-token
quantization + torch._scaled_mm above. Every FP8 profile's decode-only points at context 512 say where
a served step pays more: d 33 (the 48-row graph, _scaled_mm) against d 32 (the 32-row graph, GEMV), with
one more sequence to attend and 16 more padded rows. Printed per profile: device ms at d 16 / 17 / 24 / 25 /
32 / 33 / 48, and what d 17 and d 32 would cost on the 48-row graph, estimated as the d 33 point less the
attention of the sequences it has more (the per-sequence cost from the 48-row graph's own points, d 33 -> 48).
The bf16 profiles are printed beside for contrast (no switch there).

    python bench/results/pairs_s39/fp8_gemv_edge.py [PROFILE ...]    # default: every committed profile found
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DS = (16, 17, 24, 25, 32, 33, 48)


def points_at_512(doc: dict) -> dict[int, float]:
    out = {}
    for q in doc.get("points") or []:  # (some JSONs named profile_* are reads of one, with no points)
        if q["num_prefill_tokens"] == 0 and q["context_len"] == 512 and "decode_spread" not in q:
            out[q["num_decode_seqs"]] = q.get("device_ms_median") or q["step_ms_median"]
    return out


def main(paths: list[str]) -> None:
    if not paths:
        listed = subprocess.run(["git", "ls-files", "bench/results/*profile_*.json"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.split()
        paths = [str(ROOT / p) for p in listed if "standin" not in p]
    seen = set()
    print(f"{'profile':62s} {'card':5s} {'weights':7s} " + " ".join(f"d{d:<5d}" for d in DS)
          + "  d17@48  d32@48  gain17  gain32")
    for path in sorted(paths):
        doc = json.loads(Path(path).read_text())
        m = points_at_512(doc)
        if not all(d in m for d in DS):
            continue
        key = tuple(round(m[d], 3) for d in DS)
        if key in seen:  # copies of one profile (stand-ins, re-read parts)
            continue
        seen.add(key)
        card = next((c for c in ("H100", "H200") if c in doc.get("device_name", "")), "?")
        per_seq = (m[48] - m[33]) / 15  # attention (and sampling) per sequence on the 48-row graph
        at48 = {d: m[33] - (33 - d) * per_seq for d in (17, 32)}
        gains = {d: (m[d] - at48[d]) / m[d] * 100 for d in (17, 32)}
        name = str(Path(path).relative_to(ROOT / "bench/results")) if str(path).startswith(str(ROOT)) else path
        print(f"{name[-62:]:62s} {card:5s} {(doc.get('quantization') or 'none').replace('none', 'bf16'):7s} "
              + " ".join(f"{m[d]:6.2f}" for d in DS)
              + f"  {at48[17]:6.2f}  {at48[32]:6.2f}  {gains[17]:+5.1f}%  {gains[32]:+5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
