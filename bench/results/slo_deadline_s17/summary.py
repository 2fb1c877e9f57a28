"""Issue 31, s17 (H31D): per live run (live.sh outputs, after collect.sh) the decision fidelity of
gateway A's admission decisions (sim replay vs live: same decision share, refused live / sim) and
the deadline order's promotions the backends logged (promotions.txt), pooled per form (d*, e*).

    python summary.py live_* [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict


def one(run):
    with open(os.path.join(run, "decision_fidelity.json")) as fh:
        text = fh.read()
    d = json.loads(text[text.index("{"):])
    adm = d["admission"]
    prom = 0
    p = os.path.join(run, "promotions.txt")
    if os.path.exists(p):
        with open(p) as fh:
            prom = sum(int(line.split("deadline order: ")[1].split()[0]) for line in fh if "deadline order:" in line)
    return {"run": os.path.basename(run.rstrip("/")), "same": adm["same_decision_share"],
            "n": adm["num_arrivals"], "refused_live_sim": adm["refused"], "promoted": prom}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = [one(r) for r in a.runs]
    forms = defaultdict(list)
    for x in rows:
        print(f"{x['run']}: same decisions {100 * x['same']:.1f}% of {x['n']}; refused live/sim "
              f"{x['refused_live_sim'][0]}/{x['refused_live_sim'][1]}; promotions {x['promoted']}")
        forms[x["run"].replace("live_", "")[0]].append(x)
    print()
    for f, xs in sorted(forms.items()):
        same = sum(x["same"] * x["n"] for x in xs) / sum(x["n"] for x in xs)
        print(f"form {f}*: {len(xs)} runs; same decisions {100 * same:.2f}% (runs "
              f"{100 * min(x['same'] for x in xs):.1f}-{100 * max(x['same'] for x in xs):.1f}%); "
              f"promotions per run {sum(x['promoted'] for x in xs) / len(xs):.1f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=0)


if __name__ == "__main__":
    main()
