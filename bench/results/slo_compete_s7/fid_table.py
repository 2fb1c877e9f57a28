"""The fidelity table (from this directory): `python fid_table.py w05a w05b ...` (fid_join.json
and load.txt of each fid_RUN)."""
import json
import sys
from pathlib import Path

print("| run | rate | load | mean window live / sim | same admission decisions (forced) | "
      "same windows (forced) | requests in the same window (forced) | TTFT p50 live / sim ms (admitted on both) | sim vs live |")
print("|---|---|---|---|---|---|---|---|---|")
for run in sys.argv[1:]:
    d = json.loads(Path(f"fid_{run}/fid_join.json").read_text())
    rate = Path(f"fid_{run}/rate.txt").read_text().split()[-2]
    load = [line.split()[-1] for line in Path(f"fid_{run}/load.txt").read_text().splitlines()]
    lt, st = d["ttft_p50_ms_both_live_sim"]
    print(f"| {run} | {rate} | {'-'.join(load)} | {d['mean_window'][0]:.1f} / {d['mean_window'][1]:.1f} | "
          f"{100 * d['same_decision']:.1f}% ({100 * d['same_decision_forced']:.1f}%) | "
          f"{100 * d['same_windows']:.1f}% ({100 * d['same_windows_forced']:.1f}%) | "
          f"{100 * d['requests_same_window']:.1f}% ({100 * d['requests_same_window_forced']:.1f}%) | "
          f"{lt:.0f} / {st:.0f} | {100 * (st / lt - 1):+.1f}% |")
