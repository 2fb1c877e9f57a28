"""Issue 35, session 41: `prefill_by_clock.txt` per part and load: the runs' median board power, slow-clock share,
live / paused and the default model / paused over the busy steps with prefill (runs of >= 200 such steps; an
interrupted part's runs are labelled in seed-load order).   python bench/results/pairs_s41/by_power.py"""
import collections
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOADS = ("0.5x", "0.8x", "0.95x")
print("| part | load | runs | board power W (median) | slow-clock share % | live / paused | default model / paused |"
      " default / live |")
print("|---|---|---|---|---|---|---|---|")
for block in re.split(r"^# ", (HERE / "prefill_by_clock.txt").read_text(), flags=re.MULTILINE)[1:]:
    name = block.split(":")[0].replace("bench/results/", "").rsplit("/", 1)[0]
    acc = collections.defaultdict(list)
    for ln in block.splitlines():
        t = ln.split()
        if re.match(r"0\.(5|8|95)x$", t[0] if t else "") and t[1] == "seed":
            load, n, slow = t[0], int(t[3]), float(t[5])
        elif t[:1] == ["run"] and t[1].isdigit():
            load, n, slow = LOADS[int(t[1]) % 3], int(t[2]), float(t[4])
        else:
            continue
        if n >= 200:
            acc[load].append((float(t[-3]), slow, float(t[-1]), float(t[-2])))
    for load in LOADS:
        v = acc.get(load)
        if v:
            k = len(v)
            print(f"| {name} | {load} | {k} | {sorted(x[0] for x in v)[k // 2]:.0f} | {sum(x[1] for x in v) / k:.0f} "
                  f"| {sum(x[2] for x in v) / k:.4f} | {sum(x[3] for x in v) / k:.4f} | {sum(x[3] / x[2] for x in v) / k:.4f} |")
