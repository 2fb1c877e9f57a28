"""Issue 31, tenth session: the live runs' SLO outcome (gateway A, admission on) side by side:
this session's hash_* and the ninth session's paced_* (same command, tie-break load).
    .venv/bin/python bench/results/slo_tie_s10/live_outcome.py"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
print("| run | refused / 600 | admitted missing deadline | TTFT p50 / p99 ms |")
print("|---|---|---|---|")
for d in sorted(HERE.parent.glob("slo_read_s9/paced_w*")) + sorted(HERE.glob("hash_w*")):
    j = json.loads((d / "slo_control.json").read_text())
    a, c = j["admission"], j["compare"]
    print(f"| {d.parent.name}/{d.name} | {a['num_errors']} | {100 * c['accepted_missing_deadline']:.1f}% | "
          f"{a['ttft_ms']['p50']:.0f} / {a['ttft_ms']['p99']:.0f} |")
