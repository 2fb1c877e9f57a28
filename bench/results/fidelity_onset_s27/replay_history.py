"""Issue 35, session 27: call 3's one-chunk steps (<= 256 tokens, not after idle) by the step before them
in the replay's order (decode-only or with prefill) and by their chunk's start: pipelined / paused,
live / pipelined and model / live of each group's total.

    python bench/results/fidelity_onset_s27/replay_history.py COMPOSITIONS.json REPLAY.json
"""
import json
import sys
from pathlib import Path


def main(comp_path: str, replay_path: str) -> None:
    comp = {s["i"]: s for s in json.loads(Path(comp_path).read_text())["steps"]}
    rep = json.loads(Path(replay_path).read_text())["steps"]
    groups: dict[str, list] = {}
    for k, r in enumerate(rep[1:], start=1):
        s = comp[r["i"]]
        if s["idle_before"] or not s["p"] or len(s["chunks"]) != 1 or s["p"] > 256:
            continue
        prev = comp[rep[k - 1]["i"]]
        key = ("after decode-only" if not prev["p"] else "after prefill") + \
            (", chunk start 0" if s["chunks"][0][1] == 0 else ", chunk start > 0")
        groups.setdefault(key, []).append((r["pipelined_ms"], r["paused_ms"], s["live_device_ms"], s["model_ms"]))
    for key, v in sorted(groups.items()):
        pipe, paused, live, model = (sum(x[j] for x in v) for j in range(4))
        print(f"{key:36s} n {len(v):3d}  pipelined/paused {pipe / paused:.4f}  live/pipelined {live / pipe:.4f}  "
              f"model/live {model / live:.4f}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
