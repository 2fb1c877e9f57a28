"""Issue 35, round 2: path_model.py's per-run errors pooled over sessions, constant vs per-stream
path, mean ± 95% Student-t interval (bold: the interval inside the bound: P50 5%, P99 10%,
throughput 2%).

    python pool_path_model.py TITLE A.json [B.json ...]
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from bench.simulator.fidelity_stats import mean_ci

BOUND = {"ttft_p50": 0.05, "ttft_p99": 0.10, "tpot_p50": 0.05, "tpot_p99": 0.10, "throughput": 0.02}
docs = [json.loads(Path(f).read_text()) for f in sys.argv[2:]]
rows = [r for d in docs for r in d["rows"]]
print(f"**{sys.argv[1]}** (path: " + "; ".join(
    f"{d['constant_ms']:.2f} ms -> {d['base_ms']:.2f} + {d['per_stream_ms']:.3f} x streams" for d in docs) + ")\n")
metrics = [m for m in BOUND if any(r["metric"] == m for r in rows)]
print("| path | load | " + " | ".join(m.replace("_", " ").upper().replace("THROUGHPUT", "throughput")
                                       for m in metrics) + " | runs |")
print("|---" * (len(metrics) + 3) + "|")
loads = sorted({r["load"] for r in rows}, key=lambda s: float(s.rstrip("x")))
for model in ("constant", "per_stream"):
    for ld in loads:
        cells, n = [], 0
        for m in metrics:
            s = mean_ci([r["rel_err"] for r in rows if r["model"] == model and r["load"] == ld and r["metric"] == m])
            n = s["n"]
            txt = f"{100 * s['mean']:+.1f} ± {100 * s['ci']:.1f}"
            cells.append(f"**{txt}**" if abs(s["mean"]) + s["ci"] <= BOUND[m] else txt)
        name = "constant (before)" if model == "constant" else "per stream (after)"
        print(f"| {name} | {ld} | " + " | ".join(cells) + f" | {n} |")
