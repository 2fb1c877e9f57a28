"""Issue 35, session 31: per table (fidelity_table markdown), to 0.95x: intervals inside the bound (bold) and means
inside (P50 5 %, P99 10 %, throughput 2 %), of 15.   python count.py TABLE.md [...]"""
import re
import sys
from pathlib import Path

BOUND = (5, 10, 5, 10, 2)  # TTFT P50, TTFT P99, TPOT P50, TPOT P99, throughput
for path in sys.argv[1:]:
    ivals = means = 0
    for line in Path(path).read_text().splitlines():
        cols = [c.strip() for c in line.split("|")]
        if len(cols) < 13 or cols[6] not in ("0.5x", "0.8x", "0.95x"):
            continue
        for cell, b in zip(cols[7:12], BOUND):
            ivals += cell.startswith("**")
            means += abs(float(re.match(r"\**([-+]?[\d.]+)", cell).group(1))) <= b
    print(f"{path}: intervals {ivals} / 15, means {means} / 15")
