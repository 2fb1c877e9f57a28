"""Which SM clocks the profile's steps and the live steps ran at (issue 18, the profile's prefill
overcharge): reads `scripts/fidelity_h200.sh`'s nvidia-smi log (every 100 ms), the backend's step
log (wall-clock start `t` and length `ms` of each step) and the profile JSON, and prints the clock
during the live prefill steps (by the step's size and by the prefill work in the 0.5 s before it)
and during the profile's measurement. No device time: it reads the committed files.

    python -m bench.simulator.h200_clocks smi_33b.csv[.gz] steps_33b.jsonl[.gz] profile_33b.json
"""
from __future__ import annotations

import bisect
import datetime
import gzip
import json
import statistics
import sys


def read_smi(path: str) -> tuple[list[float], list[dict]]:
    """(epoch seconds, row) sorted by time; columns named by the '# ' header line."""
    times, rows, cols = [], [], None
    with open_text(path) as fh:
        for line in fh:
            if line.startswith("#"):
                cols = [c.strip() for c in line[1:].strip().split(",")]
                continue
            parts = [p.strip() for p in line.split(",")]
            if cols is None or len(parts) != len(cols):
                continue
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").replace(
                    tzinfo=datetime.timezone.utc).timestamp()
            except ValueError:
                continue
            row = dict(zip(cols, parts))
            for key in ("clocks.sm", "power.draw"):
                try:
                    row[key] = float(row[key])
                except (KeyError, ValueError):
                    row[key] = None
            times.append(t)
            rows.append(row)
    return times, rows


def window(times, rows, t0: float, t1: float, key: str) -> list[float]:
    """The samples of `key` taken inside [t0, t1] (a step of >= 100 ms holds one at least; a
    shorter one may hold none)."""
    i, j = bisect.bisect_left(times, t0), bisect.bisect_right(times, t1)
    return [rows[k][key] for k in range(i, j) if rows[k][key] is not None]


def open_text(path: str):
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def main(argv: list[str]) -> int:
    smi_path, steps_path = argv[0], argv[1]
    times, rows = read_smi(smi_path)
    with open_text(steps_path) as fh:
        steps = [json.loads(x) for x in fh if x.strip()]
    print(f"{len(rows)} clock samples, {len(steps)} live steps")
    # live prefill steps: the clock sampled during each, grouped by the prefill tokens run in the
    # 0.5 s before it (sustained compute-bound work is what lowers the clock under a power cap)
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for i, s in enumerate(steps):
        if s["prefill_tokens"] < 256:
            continue
        clk = window(times, rows, s["t"], s["t"] + s["ms"] / 1000, "clocks.sm")
        pw = window(times, rows, s["t"], s["t"] + s["ms"] / 1000, "power.draw")
        if not clk:
            continue
        before = sum(x["prefill_tokens"] for x in steps[max(0, i - 40):i] if x["t"] > s["t"] - 0.5)
        key = "0" if before == 0 else "1-1023" if before < 1024 else ">=1024"
        groups.setdefault(key, []).append((s["ms"] / max(1, s["prefill_tokens"] + s["decodes"]),
                                           statistics.fmean(clk), statistics.fmean(pw) if pw else 0))
    print("live steps with >= 256 prefill tokens, by prefill tokens in the 0.5 s before:")
    for key in ("0", "1-1023", ">=1024"):
        v = groups.get(key, [])
        if v:
            print(f"  {key:>7s}: {len(v):4d} steps  ms/token {statistics.median(a for a, _, _ in v):.4f}"
                  f"  SM clock {statistics.median(b for _, b, _ in v):6.0f} MHz"
                  f"  power {statistics.median(c for _, _, c in v):5.0f} W")
    if len(argv) > 2:
        with open(argv[2]) as fh:
            prof = json.load(fh)
        pts = [p for p in prof["points"] if p.get("sm_clock_mhz") is not None]
        pre = [p["sm_clock_mhz"] for p in pts if p["num_prefill_tokens"]]
        dec = [p["sm_clock_mhz"] for p in pts if not p["num_prefill_tokens"]]
        if pre:
            print(f"profile (pause {prof.get('pause_ms', 0)} ms): SM clock after prefill points median "
                  f"{statistics.median(pre):.0f} MHz (min {min(pre)}), after decode points "
                  f"{statistics.median(dec) if dec else float('nan'):.0f}")
        for r in (prof.get("pause_check") or {}).get("runs", []):
            if "step_ms_median" not in r:  # "stream_mixed": device times by shape, no one median
                continue
            print(f"  pause check {r['run']:12s} pause {r['pause_ms']:5.1f} ms: median {r['step_ms_median']:.3f}"
                  f" ms (min {r['step_ms_min']:.3f}, max {r['step_ms_max']:.3f}), SM {r['sm_clock_mhz']} MHz")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
