"""Issue 35, session 27: `bench.engine.replay_live`'s device times beside the live ones and the model's,
by step kind (steps after an idle spell left out: the model adds their launch, the device time has none):

- live / pipelined: what the live process adds to the same compositions run as the serving loop runs them;
- pipelined / paused: what running in a stream adds to the profile's way of timing a step;
- model / paused: the cost model against the profile's way of timing, at live compositions;
- model / live: the product, the error the grid sees.

    python bench/results/fidelity_onset_s27/live_replay_read.py COMPOSITIONS.json REPLAY.json
"""
import json
import sys
from pathlib import Path


def kind(s: dict) -> str:
    if not s["p"]:
        return "decode-only"
    k = len(s["chunks"])
    if s["p"] > 256:
        return "prefill > 256 tokens"
    return "one chunk <= 256 tokens" if k == 1 else "two or more chunks <= 256"


def main(comp_path: str, replay_path: str) -> None:
    comp = {s["i"]: s for s in json.loads(Path(comp_path).read_text())["steps"]}
    rep = json.loads(Path(replay_path).read_text())
    print(f"{rep.get('device_name')}, {rep.get('model')}, {rep['passes']} pipelined passes, source {rep.get('source')}")
    groups: dict[str, list] = {}
    for r in rep["steps"]:
        s = comp[r["i"]]
        if s["idle_before"]:
            continue
        groups.setdefault(kind(s), []).append((s["live_device_ms"], r["pipelined_ms"], r.get("paused_ms"), s["model_ms"]))
    print(f"{'kind':28s} {'n':>4s} {'live/pipelined':>15s} {'pipelined/paused':>17s} {'model/paused':>13s} {'model/live':>11s}")
    for k in ("decode-only", "one chunk <= 256 tokens", "two or more chunks <= 256", "prefill > 256 tokens"):
        g = groups.get(k)
        if not g:
            continue
        live, pipe, paused, model = (sum(x[j] for x in g) for j in (0, 1, 2, 3)) if g[0][2] is not None else \
            (sum(x[0] for x in g), sum(x[1] for x in g), float("nan"), sum(x[3] for x in g))
        print(f"{k:28s} {len(g):4d} {live / pipe:15.4f} {pipe / paused:17.4f} {model / paused:13.4f} {model / live:11.4f}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
