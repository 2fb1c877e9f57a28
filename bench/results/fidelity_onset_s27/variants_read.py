"""Issue 35, session 27, call 5: the replay of three variants of 120 live steps with prefill (and the decode
steps before them): as live, with each step's decode contexts made equal (their mean), and with every chunk
started at position 0. Pipelined / paused device time of each variant's steps with prefill (not after idle),
by the step before (with prefill or decode-only).

    python bench/results/fidelity_onset_s27/variants_read.py COMPOSITIONS.json REPLAY.json
"""
import json
import sys
from pathlib import Path


def main(comp_path: str, replay_path: str) -> None:
    comp = {s["i"]: s for s in json.loads(Path(comp_path).read_text())["steps"]}
    rep = json.loads(Path(replay_path).read_text())["steps"]
    groups: dict[tuple, list] = {}
    for k, r in enumerate(rep[1:], start=1):
        s, prev = comp[r["i"]], comp[rep[k - 1]["i"]]
        if not s["p"] or s["idle_before"]:
            continue
        key = (s["variant"], "after prefill" if prev["p"] else "after decode-only")
        groups.setdefault(key, []).append((r["pipelined_ms"], r["paused_ms"]))
    for key in sorted(groups):
        g = groups[key]
        print(f"{key[0]:16s} {key[1]:18s} n {len(g):4d}  pipelined / paused {sum(a for a, _ in g) / sum(b for _, b in g):.4f}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
