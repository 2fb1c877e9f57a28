"""Issue 35, session 27: ab.sh's replays pooled as fidelity_grid_state/run.sh pools them, and per cell
and form the count of figures up to 0.95x whose 95% interval over the seeds is inside the issue's
bound (P50 5%, P99 10%, throughput 2%) / whose mean is inside / all, with the TTFT and TPOT P50 means
(%) at 0.5 / 0.8 / 0.95x.   python score.py REPLAY_DIR"""
import json
import subprocess
import sys
from pathlib import Path

LOADS = ("0.5x", "0.8x", "0.95x")
CELLS = {"33b-5seeds": ["33b-s11", "33b-s13"], "6.7b-mixed-s25-5seeds": ["6.7b-mixed-s25", "6.7b-mixed-s25-4"],
         "33b-mixed-s25-3seeds": ["33b-mixed-s25-1", "33b-mixed-s25-2"],
         **{p: [p] for p in ("6.7b-s13", "6.7b-s14", "6.7b-s16", "6.7b-fp8-s16", "33b-fp8-s16", "33b-fp8-s17",
                             "6.7b-mixed-s20", "33b-kvint4-s20", "33b-mixed-s20")}}


def main(d: Path) -> None:
    tot = {}
    print("| cell | form | intervals / means inside / figures | TTFT P50 % | TPOT P50 % |\n|---|---|---|---|---|")
    for cell, parts in CELLS.items():
        for form in ("slow", "fast"):
            out = d / f"t_{cell}_{form}.json"
            files = [str(d / f"r_{p}_{form}.json") for p in parts]
            subprocess.run([sys.executable, "-m", "bench.simulator.fidelity_table", *(["--pool"] if len(files) > 1 else []),
                            *files, "--json", str(out)], check=True, capture_output=True)
            cells = [c for c in json.loads(out.read_text()) if c["load"] in LOADS]
            ins = sum(v["inside"] for c in cells for v in c["figures"].values())
            mi = sum(v["mean_inside"] for c in cells for v in c["figures"].values())
            n = sum(len(c["figures"]) for c in cells)
            t = tot.setdefault(form, [0, 0, 0])
            t[0] += ins
            t[1] += mi
            t[2] += n
            fig = {k: " / ".join(f"{100 * c['figures'][k]['mean']:+.1f}" for c in cells) for k in ("ttft_p50", "tpot_p50")}
            print(f"| {cell} | {form} | {ins} / {mi} / {n} | {fig['ttft_p50']} | {fig['tpot_p50']} |")
    for form, (i, m, n) in tot.items():
        print(f"\n{form}: {i} intervals and {m} means inside of {n}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
