"""Issue 35: pool path_whatif.py's per-run errors over sessions (the 33B's s11 + s13 seeds).

    python pool_path_whatif.py A.json B.json ...
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from bench.simulator.fidelity_stats import mean_ci

rows = [r for f in sys.argv[1:] for r in json.loads(Path(f).read_text())]
loads = sorted({r["load"] for r in rows}, key=lambda s: float(s.rstrip("x")))
print(f"{'load':6s} {'metric':9s} {'constant path':>18s} {'per-stream path':>18s}  runs")
for ld in loads:
    for m in ("ttft_p50", "ttft_p99"):
        c = mean_ci([r["rel_err"] for r in rows if r["load"] == ld and r["metric"] == m and r["path"] == "c"])
        s = mean_ci([r["rel_err"] for r in rows if r["load"] == ld and r["metric"] == m and r["path"] == "s"])
        print(f"{ld:6s} {m:9s} {100 * c['mean']:+8.1f} ± {100 * c['ci']:4.1f}   "
              f"{100 * s['mean']:+8.1f} ± {100 * s['ci']:4.1f}  {c['n']}")
