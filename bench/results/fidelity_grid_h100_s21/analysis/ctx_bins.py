"""Issue 35, session 20: a part's decode-only steps and steps with a 129-256-token chunk, binned by
decodes and by the context a sequence (total / decodes): the grid state's model (with the measured
spread term) over live. Run from the repo root: python ctx_bins.py PART_DIR"""
import sys
from pathlib import Path

from prefill_bins import load

from bench.simulator import fidelity_steps as fs

part = Path(sys.argv[1]); tag = part.name
steps, bad, cost, terms = load(part)
res = {i: t for i, t, f in fs.model_step_ms(cost, steps)}
print(tag)
for kind in ("decode", "mixed"):
  for dlo, dhi in ((1, 1), (2, 8), (9, 32), (33, 128)):
    line = []
    for clo, chi in ((1, 400), (401, 600), (601, 800), (801, 1000), (1001, 1400), (1401, 99999)):
        sel = [i for i, s in enumerate(steps) if i in res and dlo <= s["d"] <= dhi and ((not s["p"]) if kind == "decode" else 129 <= s["p"] <= 256)
               and s["d"] and clo <= s["ctx"] / s["d"] <= chi]
        line.append(f"{sum(res[i] for i in sel)/sum(steps[i]['ms'] for i in sel):.3f}/{len(sel):<5d}" if len(sel) >= 20 else " " * 11)
    print(f"{kind:6s} d {dlo:3d}-{dhi:<3d} " + " ".join(line))
print("ctx/seq bins: <=400, 401-600, 601-800, 801-1000, 1001-1400, >1400   (model/live / n)")
