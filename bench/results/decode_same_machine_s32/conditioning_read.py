"""Issue 35, session 32: read `conditioning_check.sh`: each profile's decode-only points at the middle context
over the paused replay of the same shape, the grid pass's batches and the bucket pass's apart.

    python bench/results/decode_same_machine_s32/conditioning_read.py DIR CONTEXT
"""
import json
import sys
from pathlib import Path

import numpy as np


def main(root: Path, c: int) -> int:
    comps = json.loads((root / "compositions.json").read_text())["steps"]
    rep = {r["i"]: r for r in json.loads((root / "replay.json").read_text())["steps"]}
    replay = {len(s["ctxs"]): rep[s["i"]].get("paused_ms") for s in comps}
    out = {}
    for v in ("on", "off"):
        f = root / f"profile_{v}.json"
        if not f.exists():
            continue
        doc = json.loads(f.read_text())
        grid = {int(x) for x in (doc.get("decode_batch_sizes") or [])}
        pts = {p["num_decode_seqs"]: p.get("device_ms_median", p["step_ms_median"]) for p in doc["points"]
               if not p["num_prefill_tokens"] and p["num_decode_seqs"] and p["context_len"] == c}
        first_bucket = {p["num_decode_seqs"] for p in doc["points"] if p.get("num_prefill_tokens")}
        rows = {d: pts[d] / replay[d] for d in sorted(pts) if replay.get(d)}
        out[v] = rows
        print(f"conditioning {v} ({doc.get('decode_conditioning')}): profile / paused replay at context {c}")
        print("   " + "  ".join(f"d{d} {r:.4f}" for d, r in rows.items()))
        g = [r for d, r in rows.items() if d in (first_bucket | grid)]
        b = [r for d, r in rows.items() if d not in (first_bucket | grid)]
        if g and b:
            print(f"   grid pass (d with a mixed point) mean {np.mean(g):.4f}, bucket pass mean {np.mean(b):.4f}, "
                  f"bucket / grid {np.mean(b) / np.mean(g):.4f}")
    if "on" in out and "off" in out:
        both = [d for d in out["on"] if d in out["off"]]
        print("on / off: " + "  ".join(f"d{d} {out['on'][d] / out['off'][d]:.4f}" for d in both))
    return 0 if out else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
