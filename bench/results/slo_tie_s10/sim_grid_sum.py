"""Issue 31, tenth session: sim_grid.sh's JSONs summed per tie-break and rate (mean over seeds:
attainment per class as `tidegate sim slo` reports it, refused, TTFT p99 per class)."""
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

rows = defaultdict(list)
for f in sorted(Path(sys.argv[1]).glob("*.json")):
    tie, rate, _ = f.stem.split("_")
    r = json.loads(f.read_text())["rows"][-1]
    rows[(rate, tie)].append(r)
print("| load | tie-break | seeds | Fast met | Normal met | Slow met | refused / 600 | TTFT p99 Fast / Normal / Slow ms |")
print("|---|---|---|---|---|---|---|---|")
for (rate, tie), rs in sorted(rows.items()):
    a = {c: 100 * np.mean([r["attainment"][c] for r in rs]) for c in ("fast", "normal", "slow")}
    p = {c: np.mean([r["ttft_p99_ms"][c] for r in rs]) for c in ("fast", "normal", "slow")}
    print(f"| {rate} | {tie} | {len(rs)} | {a['fast']:.1f}% | {a['normal']:.1f}% | {a['slow']:.1f}% | "
          f"{np.mean([r['refused'] for r in rs]):.1f} | {p['fast']:.0f} / {p['normal']:.0f} / {p['slow']:.0f} |")
