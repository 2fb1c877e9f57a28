"""Issue 35 / prediction 31 (session 40): the FP8 services' decode-only steps by batch, at the GEMV switch 32
(the default: Triton GEMV up to 32 rows) and 16 (`--fp8-gemv-max-m 16`: `_scaled_mm` from 17 rows).

    python bench/results/pairs_s40/fp8_switch_steps.py RESULTS_DIR [RESULTS_DIR ...]

Each RESULTS_DIR is a `scripts/gpu_serving_run.sh` folder with steps_<config>.jsonl(.gz); prints the device ms
median per decode batch range and config, and each config's ratio over gemv32 of the same folder.
"""
import gzip
import json
import statistics
import sys
from pathlib import Path

RANGES = [(1, 8), (9, 16), (17, 24), (25, 32), (33, 48), (49, 64)]


def read(path: Path) -> list[dict]:
    op = gzip.open if path.suffix == ".gz" else open
    with op(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str]) -> None:
    for d in map(Path, argv):
        by = {}
        for p in sorted(d.glob("steps_*.jsonl*")):
            cfg = p.name.split(".")[0][len("steps_"):]
            rows = [s for s in read(p) if not s.get("prefill_tokens") and s.get("decodes") and s.get("device_ms")]
            by[cfg] = {r: [s["device_ms"] for s in rows if r[0] <= s["decodes"] <= r[1]] for r in RANGES}
        print(f"== {d}: decode-only steps, device ms median (n); ratio over gemv32")
        print(f"{'config':10s} " + " ".join(f"{f'd {a}-{b}':>22s}" for a, b in RANGES))
        base = by.get("gemv32", {})
        for cfg, rs in by.items():
            cells = []
            for r in RANGES:
                xs = rs[r]
                if not xs:
                    cells.append(f"{'-':>22s}")
                    continue
                m = statistics.median(xs)
                ref = statistics.median(base[r]) if base.get(r) else None
                cells.append(f"{m:7.3f} ({len(xs):4d}) {m / ref if ref else float('nan'):6.3f}")
            print(f"{cfg:10s} " + " ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
