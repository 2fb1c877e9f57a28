"""Live goodput by rate and mode over every run folder here (r<RATE>_s<SEED>_<modes>), the live
knees (sims.placement_study.knee at 90%) and the table rows of the BENCHMARKS section.
    .venv/bin/python bench/results/kv_pull_cpu/cpu_share_s14/summarize_live.py
"""
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
from sims.placement_study import knee

by = defaultdict(list)
pairs = defaultdict(list)
for d in sorted(here.glob("r*_s*_*")):
    m = re.match(r"r([\d.]+)_s(\d+)_(.+)", d.name)
    rate, seed = float(m.group(1)), int(m.group(2))
    got = {}
    for f in d.glob("live_*.json"):
        mode = f.stem[5:]
        got[mode] = json.loads(f.read_text())["goodput_fraction"]
        by[(rate, mode)].append(got[mode])
    if len(got) == 2:
        pairs[rate].append((seed, m.group(3), got["off"], got["thread"]))
rates = sorted({r for r, _ in by})
out = {"rates": rates, "runs": {f"{r}:{m}": v for (r, m), v in by.items()}}
for mode in ("off", "thread"):
    rs = [r for r in rates if (r, mode) in by]
    means = [sum(by[(r, mode)]) / len(by[(r, mode)]) for r in rs]
    out[f"mean_{mode}"] = dict(zip(rs, means))
    out[f"knee_{mode}"] = knee(rs, means)
    print(mode, " ".join(f"{r:g}:{g:.3f}(n{len(by[(r, mode)])})" for r, g in zip(rs, means)),
          "knee", out[f"knee_{mode}"])
for r, ps in sorted(pairs.items()):
    off = sum(p[2] for p in ps) / len(ps)
    on = sum(p[3] for p in ps) / len(ps)
    print(f"pairs at {r:g}: n {len(ps)} off {off:.3f} thread {on:.3f} gain {on - off:+.3f}; "
          f"pull >= off in {sum(p[3] >= p[2] for p in ps)}; "
          + ", ".join(f"s{s} {o} {a:.3f}/{b:.3f}" for s, o, a, b in ps))
    out[f"pairs_{r:g}"] = ps
(here / "live_summary.json").write_text(json.dumps(out, indent=1))
