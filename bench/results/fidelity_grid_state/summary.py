"""One line per grid part: how many of its cells up to 0.95x have the 95% interval inside the
issue's bound (P50 5%, P99 10%, throughput 2%: 3 loads x 5 figures = 15), how many have the mean
inside (and of the cells outside, how many the engine's own noise alone keeps out on these seeds:
fidelity_table's †), same prefill chunks per load (goal >= 97% to 0.95x) beside their ceiling (the simulator
against itself with the engine's own noise drawn: `validate_replay --ceiling`, what a model exact
in its mean timings would share with a live run), and what the part's profile carries
(the pause check's sustained runs, which the cost model's power terms read). Reads the
fidelity_table JSONs that run.sh's `tables` step leaves (table_<part>_<form>.json).

    python summary.py > summary.md
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOADS = ("0.5x", "0.8x", "0.95x")
# run.sh's pooled rows (several calls' seeds, one table) -> a part whose profile they share
POOLED = {"33b-5seeds": "33b-s13", "6.7b-mixed-s25-5seeds": "6.7b-mixed-s25", "33b-mixed-s25-3seeds": "33b-mixed-s25-1",
          "h100-6.7b-fp8-10seeds": "h100-6.7b-fp8-s35", "h100-6.7b-6seeds": "h100-6.7b-s35",
          "h100-6.7b-8seeds": "h100-6.7b-s38", "h100-33b-kvint4-5seeds": "h100-33b-kvint4-s38",
          "h100-33b-5seeds": "h100-33b-s39", "h100-6.7b-13runs": "h100-6.7b-s40", "h100-33b-6runs": "h100-33b-s40",
          "h100-33b-fp8-8seeds": "h100-33b-fp8-s41", "h100-33b-kvint4-7seeds": "h100-33b-kvint4-s41"}


def profile_of(part: str) -> dict | None:
    """The part's profile (from run.sh's source table)."""
    src = re.search(rf"\[{re.escape(part)}\]=(\S+)", (HERE / "run.sh").read_text())
    if not src:
        return None
    folder = HERE.parent / src.group(1)
    name = src.group(1).rsplit("/", 1)[1]
    return json.loads((folder / f"profile_{name}.json").read_text())


def card(prof: dict | None) -> str:
    """H100 / H200 from the profile's device name: the cells of the two cards are not one cell."""
    name = (prof or {}).get("device_name") or "?"
    return next((c for c in ("H100", "H200") if c in name), name)


def profile_runs(prof: dict | None) -> str:
    """The pause check's sustained runs, and whether the profile carries the tile-edge pairs (which
    the default charges since session 35)."""
    if prof is None:
        return "?"
    runs = [r.get("run") for r in (prof.get("pause_check") or {}).get("runs", [])]
    kept = [r for r in runs if r and r.startswith("sustained")]
    out = ", ".join(kept) if kept else ("pause check, no sustained run" if runs else "no pause check")
    return out + ("; tile-edge pairs" if prof.get("tile_edge_pairs") else "")


def main() -> int:
    order = ["33b-5seeds", *re.search(r'ORDER="([^"]+)"', (HERE / "run.sh").read_text()).group(1).split(),
             *(p for p in POOLED if p != "33b-5seeds")]
    rank = {p: i for i, p in enumerate(order)}
    found = [(*f.stem[len("table_"):].rsplit("_", 1), f) for f in HERE.glob("table_*.json")]
    rows = []
    for part, form, f in sorted(found, key=lambda x: (rank.get(x[0], len(rank)), x[1] != "default")):
        cells = [c for c in json.loads(f.read_text()) if c["load"] in LOADS]
        inside = sum(v["inside"] for c in cells for v in c["figures"].values())
        means = sum(v["mean_inside"] for c in cells for v in c["figures"].values())
        total = sum(len(c["figures"]) for c in cells)
        # outside, mean inside, and the engine's own noise alone wider than the room left (fidelity_table's †)
        seed_bound = sum(bool(v.get("seed_bound")) for c in cells for v in c["figures"].values())
        chunks = " / ".join(f"{100 * c['same_chunks'][0]:.1f}" for c in cells)
        # the simulator against itself with the engine's noise drawn (validate_replay --ceiling)
        ceil = (" / ".join(f"{100 * c['same_chunks_ceiling']:.1f}" for c in cells)
                if all(c.get("same_chunks_ceiling") is not None for c in cells) else "–")
        first = cells[0]
        prof = profile_of(POOLED.get(part, part))
        rows.append(f"| {part} | {card(prof)} | {first['model']} {first['weights']} {first['kv']} {first['lengths']} | {form} "
                    f"| {first['runs']} | {inside} / {total} | {seed_bound} | {means} / {total} | {chunks} | {ceil} "
                    f"| {profile_runs(prof)} |")
    print("| part | card | cell | simulator | seeds x requests | intervals inside (to 0.95x) | of those outside, kept out "
          "by the noise alone (†) | means inside | same chunks 0.5 / 0.8 / 0.95x (%) | their ceiling (%) "
          "| what the profile carries |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
