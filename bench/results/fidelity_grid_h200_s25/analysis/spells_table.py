"""Issue 35, session 25: the three forms of spells.sh side by side, per grid part (the seeds of one
profile pooled: this session's 6.7B mixed seeds 0-3 + 4, its 33B mixed seeds 1 + 2-3), to 0.95x:
intervals and means inside the issue's bound (P50 5%, P99 10%, throughput 2%: 15 figures), and the
P50 errors at each load. Reads replay_<part>_<form>.json; run from this folder after spells.sh:

    python spells_table.py > spells_table.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
from bench.simulator.fidelity_table import cells, pool, resummarize

FORMS = ("nocap", "cap", "cap_nospells", "cap_nomixedspread")
GROUPS = {  # the parts pooled into one row (one profile)
    "6.7b-mixed-s25 (5 seeds)": ("6.7b-mixed-s25", "6.7b-mixed-s25-4"),
    "33b-mixed-s25 (3 seeds)": ("33b-mixed-s25-1", "33b-mixed-s25-2"),
    "6.7b-mixed-s20": ("6.7b-mixed-s20",),
    "33b-mixed-s20 (1 seed)": ("33b-mixed-s20",),
    "33b-kvint4-s20": ("33b-kvint4-s20",),
    "33b-fp8-s17": ("33b-fp8-s17",),
}
LOADS = ("0.5x", "0.8x", "0.95x")


def row(name: str, parts: tuple[str, ...], form: str) -> str | None:
    files = [HERE / f"replay_{p}_{form}.json" for p in parts]
    if not all(f.exists() for f in files):
        return None
    docs = [json.loads(f.read_text()) for f in files]
    doc = pool(docs) if len(docs) > 1 else resummarize(docs[0])
    cs = [c for c in cells(doc) if c["load"] in LOADS]
    figs = [v for c in cs for v in c["figures"].values()]
    inside, means = sum(v["inside"] for v in figs), sum(v["mean_inside"] for v in figs)

    def p50(key: str) -> str:
        return " / ".join(f"{100 * c['figures'][key]['mean']:+.1f}" for c in cs)
    return (f"| {name} | {form} | {cs[0]['runs']} | {inside} / {len(figs)} | {means} / {len(figs)} "
            f"| {p50('ttft_p50')} | {p50('tpot_p50')} | {p50('ttft_p99')} |")


def main() -> int:
    print("| part | simulator | seeds x requests | intervals inside | means inside | TTFT P50 % 0.5 / 0.8 / 0.95x "
          "| TPOT P50 % | TTFT P99 % |")
    print("|---|---|---|---|---|---|---|---|")
    for name, parts in GROUPS.items():
        for form in FORMS:
            r = row(name, parts, form)
            if r:
                print(r)
    print("\nnocap: --cap-by-power off (the simulator's default before session 25); cap: --cap-by-power on "
          "(the power-by-kind weights and the decode-spells term: the default since session 25 where the "
          "profile has the mixed step's sustained run, as all of these); cap_nospells: --cap-by-power on "
          "--decode-spells off (the weights alone); cap_nomixedspread: --cap-by-power on --mixed-spread off "
          "(without the mixed steps' spread term, this session's parts only). "
          "Relative error (sim - live) / live, means over the seeds; intervals: 95% over the seeds.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
