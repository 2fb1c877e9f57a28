"""Issue 35: fidelity tables pooled over sessions and restricted to chosen seeds (mean ± 95% Student-t
interval over the runs of a cell; bold: the interval inside the bound). Rows: the sim validate's
own comparison (replay + delivery path), and the re-simulations of run.sh (fidelity_steps JSONs):
as run, the live step times fed back (diagnostic), and the what-if profile with the points the
fixed grid measures (surrogate_points.py; held-out seeds only)."""
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
from bench.simulator.fidelity_stats import mean_ci

S11 = HERE.parents[1] / "fidelity_grid_h200_s11" / "33b"
METRICS = (("ttft_p50", 0.05), ("ttft_p99", 0.10), ("tpot_p50", 0.05), ("tpot_p99", 0.10), ("throughput", 0.02))


def runs_of(path: Path, key: str = "compare_replay_path"):
    """(load label, seed, compare, (live req, live windows, sim windows) or None, same-chunk share)."""
    doc = json.loads(path.read_text())
    out = []
    if "resim" in doc:
        sched = {ld["load_label"]: {str(r["seed"]): r for r in ld["runs"]} for ld in doc.get("schedule", [])}
        for ld in doc["resim"]["loads"]:
            for r in ld["runs"]:
                s = sched.get(ld["load_label"], {}).get(str(r["seed"]), {})
                w = (s["num_requests"], *s["num_windows"]) if s.get("num_windows") else None
                out.append((ld["load_label"], int(r["seed"]), r["compare"], w, s.get("same_prefill_step_share")))
    else:
        for ld in doc["loads"]:
            for r in ld["runs"]:
                d = r.get("decisions") or {}
                w = (d["num_requests"][0], d["num_batches"][0], d["num_batches"][1]) if "num_batches" in d else None
                out.append((ld["load_label"], int(r["seed"]), r[key], w,
                            (r.get("steps_path") or {}).get("same_prefill_step_share")))
    return out


def table(title: str, sources: list[tuple[Path, set[int] | None]], key: str = "compare_replay_path") -> str:
    rows = []
    for path, seeds in sources:
        rows += [x for x in runs_of(path, key) if seeds is None or x[1] in seeds]
    loads = sorted({x[0] for x in rows}, key=lambda s: float(s.rstrip("x")))
    lines = [f"**{title}**", "",
             "| load | TTFT P50 | TTFT P99 | TPOT P50 | TPOT P99 | throughput | mean window live / sim | same prefill chunks | runs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for ld in loads:
        rs = [x for x in rows if x[0] == ld]
        cells = []
        for metric, bound in METRICS:
            s = mean_ci([x[2][metric]["rel_err"] for x in rs])
            m, ci = 100 * s["mean"], 100 * s["ci"]
            txt = f"{m:+.1f} ± {ci:.1f}" if math.isfinite(ci) else f"{m:+.1f}"
            cells.append(f"**{txt}**" if math.isfinite(ci) and abs(m) + ci <= 100 * bound else txt)
        ws = [x[3] for x in rs if x[3]]
        win = (f"{sum(w[0] for w in ws) / sum(w[1] for w in ws):.2f} / {sum(w[0] for w in ws) / sum(w[2] for w in ws):.2f}"
               if ws else "–")
        sh = [x[4] for x in rs if x[4] is not None]
        sc = mean_ci(sh) if sh else None
        same = "–" if sc is None else (f"{100 * sc['mean']:.1f}%" + (f" ± {100 * sc['ci']:.1f}" if math.isfinite(sc["ci"]) else ""))
        seeds = ",".join(str(x[1]) for x in rs)
        lines.append(f"| {ld} | " + " | ".join(cells) + f" | {win} | {same} | {len(rs)} (seeds {seeds}) |")
    return "\n".join(lines) + "\n"


V67 = HERE.parent / "6.7b" / "validate_6.7b.json"
V33a = S11 / "validate_33b.json"
V33b = HERE.parent / "33b-seeds" / "validate_33b-seeds.json"
A = HERE
out = [
    "# Issue 35 fidelity tables (bench/results/fidelity_grid_h200_s13/analysis/pooled_table.py)\n",
    ("relative error (sim - live) / live in %, mean ± 95% interval over the runs; bold: interval inside "
     "the bound (P50 5%, P99 10%, throughput 2%)\n"),
    table("33B bf16 512/128, 5 seeds (s11 seeds 0-2 + s13 seeds 3-4): sim validate's replay + delivery path (as run)",
          [(V33a, None), (V33b, None)]),
    table("33B, 5 seeds: sim validate's independent simulation (the generator's schedule, no replay)",
          [(V33a, None), (V33b, None)], key="compare"),
    table("33B, 5 seeds: re-simulated as run (fidelity_steps, the validate's model terms)",
          [(A / "steps_33b-s11_asrun.json", None), (A / "steps_33b-seeds_asrun.json", None)]),
    table("33B, 5 seeds: LIVE step times fed back (diagnostic, not a model)",
          [(A / "steps_33b-s11_live_times.json", None), (A / "steps_33b-seeds_live_times.json", None)]),
    table("33B, held-out seeds 1,2,4: as run", [(A / "steps_33b-s11_asrun.json", {1, 2}),
                                               (A / "steps_33b-seeds_asrun.json", {4})]),
    table("33B, held-out seeds 1,2,4: what-if profile with the 256-token chunk points (from seeds 0 / 3)",
          [(A / "steps_33b-s11_surrogate.json", {1, 2}), (A / "steps_33b-seeds_surrogate.json", {4})]),
    table("33B, held-out seeds 1,2,4: what-if profile with the 256-token chunk and decode bucket 24/48 points",
          [(A / "steps_33b-s11_surrogate_db.json", {1, 2}), (A / "steps_33b-seeds_surrogate_db.json", {4})]),
    table("6.7B bf16 512/128, 5 seeds: sim validate's replay + delivery path (as run)", [(V67, None)]),
    table("6.7B, 5 seeds: sim validate's independent simulation", [(V67, None)], key="compare"),
    table("6.7B, 5 seeds: re-simulated as run", [(A / "steps_6.7b_asrun.json", None)]),
    table("6.7B, 5 seeds: LIVE step times fed back (diagnostic)", [(A / "steps_6.7b_live_times.json", None)]),
    table("6.7B, held-out seeds 2,3,4: as run", [(A / "steps_6.7b_asrun.json", {2, 3, 4})]),
    table("6.7B, held-out seeds 2,3,4: what-if profile with the 256-token chunk points (from seeds 0,1)",
          [(A / "steps_6.7b_surrogate.json", {2, 3, 4})]),
    table("6.7B, held-out seeds 2,3,4: what-if profile with the 256-token chunk and decode bucket 24/48 points",
          [(A / "steps_6.7b_surrogate_db.json", {2, 3, 4})]),
]
print("\n".join(out))
