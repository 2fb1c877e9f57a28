"""Issue 35, session 21: the async loop's plan lead (bench.simulator.plan_lead: the step's end
minus the next step's plan start) binned by the duration of the step it plans behind, after
decode-only steps and after steps with prefill. Run: python lead_vs_dur.py STEPS.jsonl.gz"""
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from bench.simulator.fidelity_steps import read_steps

rows = read_steps(sys.argv[1])
rows = sorted((r for r in rows if "mono" in r), key=lambda r: r["mono"])
pts = []
for a, b in itertools.pairwise(rows):
    hp = b.get("host_ms")
    if not hp or not (a["decodes"] or a["prefill"]): continue
    end_a = a["mono"] + a["ms"] / 1e3
    if b["mono"] - end_a > 0.0005: continue
    plan_b = b["mono"] + b["ms"] / 1e3 - sum(hp) / 1e3
    pts.append((a["ms"], 1e3 * (end_a - plan_b), bool(a["prefill"]), a["prefill_tokens"], a["decodes"]))
x = np.array(pts, dtype=float)
for kind in (0, 1):
    m = x[:, 2] == kind
    print("after", "prefill" if kind else "decode-only", "n", m.sum())
    bins = np.quantile(x[m, 0], np.linspace(0, 1, 7))
    for lo, hi in itertools.pairwise(bins):
        s = m & (x[:, 0] >= lo) & (x[:, 0] <= hi)
        print(f"   step {lo:6.2f}-{hi:6.2f} ms: lead median {np.median(x[s,1]):6.2f}  p10 {np.quantile(x[s,1],.1):6.2f} p90 {np.quantile(x[s,1],.9):6.2f}  step-lead median {np.median(x[s,0]-x[s,1]):6.2f}")
