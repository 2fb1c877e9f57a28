"""Issue 35: the live path's `out` (last prefill step's end -> the client's first token) against the
streams the gateway and the client handle in that step (its decodes + prefill chunks), per run: the
median out of a run (sim validate's TTFT path) against the median sequences of its requests' first-
token steps (step log). Descriptive, for a path model the next session can fit per request
(`ttft_path_requests`, recorded from now on); nothing here feeds the simulator.

    python path_by_streams.py VALIDATE DECISIONS STEPS [...]   (triples)
"""
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench.simulator.fidelity_resim import prompt_identity
from bench.simulator.fidelity_steps import read_steps
from scheduler.decisions import read_log

args = sys.argv[1:]
for i in range(0, len(args), 3):
    v = json.loads(Path(args[i]).read_text())
    arrivals, _ = read_log(args[i + 1])
    rows = read_steps(args[i + 2])
    arr = sorted(arrivals, key=lambda a: a.t)
    _, runs = prompt_identity(v["config"], len(arr))
    run_of = {a.request_id: r for a, r in zip(arr, runs, strict=True)}
    seqs = {}
    for r in rows:
        for rid, _n, _p in r["prefill"]:
            seqs[rid] = int(r["decodes"]) + len(r["prefill"])   # the last one wins
    x, y, lab = [], [], []
    for li, ld in enumerate(v["loads"]):
        for si, run in enumerate(ld["runs"]):
            s = [seqs[rid] for rid, rr in run_of.items() if rr == (si, li) and rid in seqs]
            x.append(float(np.median(s)))
            y.append(run["ttft_path_ms"]["out"])
            lab.append(ld["load_label"])
    x, y = np.array(x), np.array(y)
    k, a = np.polyfit(x, y, 1)
    r = np.corrcoef(x, y)[0, 1]
    print(f"{args[i]}: out = {a:.2f} + {k:.3f} ms x streams (r {r:.2f}, {len(x)} runs)")
    for lb in dict.fromkeys(lab):
        m = np.array(lab) == lb
        print(f"  {lb}: streams median {x[m].mean():.1f}, out {y[m].mean():.2f} ms")
