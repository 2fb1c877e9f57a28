"""Issue 35, session 18 (H35C): the best a step-cost model of the step's shape could do at the same
prefill chunks. The replay of today's form (`validate_replay`, gateway loop on, plan lead live) with
the live step times fed back (`--live-times`), except that every step with prefill matched to a live
one is charged the mean (or median) live time of its shape group instead of its own: a model exact on average
at every shape, at every load, and right after a prefill step or not (the power state a model could
track), that cannot know a step's own jitter (call_level.txt, 3: sd 2.2-2.8% at one exact shape, 0.95x).
Decode-only steps stay live. Groups: (load, decode count, the chunks' sizes and whether each starts
past 0, the step before carried prefill); groups of fewer than `--min-group` steps keep the live time.

    python shape_mean.py [--min-group 5] [--stat mean|median] [--state] > shape_<stat>[_state].txt
(mean: each group's live time in total exactly, so no level at all, only the steps' own jitter removed)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import bench.simulator.fidelity_steps as fs
from bench.simulator.session_records import run_arrivals
from bench.simulator.validate_replay import replay_session
from scheduler.decisions import read_log

R = HERE.parent
PARTS = {"33b-s11": R / "fidelity_grid_h200_s11" / "33b", "33b-s13": R / "fidelity_grid_h200_s13" / "33b-seeds",
         "6.7b-s16": R / "fidelity_grid_h200_s16" / "6.7b"}
LOADS = ("0.5x", "0.8x", "0.95x", "1.2x")
LiveTimed = fs.LiveTimedCost


def shape_medians(rows: list[dict], load_of: dict, min_group: int, stat=np.median, busy=None) -> dict:
    """live prefill step key (as LiveTimedCost keys it) -> its shape group's `stat` of the live s
    (steps of groups smaller than `min_group`: absent, they keep their live time). `busy` (--state):
    each row's prefill-busy share of the 100 ms before it, which then joins the group in quarters."""
    groups: dict = {}
    key_of = []
    for i, row in enumerate(rows):
        if not row["prefill"]:
            continue
        g = (load_of.get(str(row["prefill"][0][0]), "warm-up"), int(row["decodes"]),
             tuple(sorted((int(n), int(st) > 0) for _r, n, st in row["prefill"])),
             bool(i and rows[i - 1]["prefill_tokens"]), None if busy is None else min(3, int(4 * busy[i])))
        groups.setdefault(g, []).append(row["ms"] / 1e3)
        key_of.append((frozenset((str(r), int(n), int(st)) for r, n, st in row["prefill"]), g))
    med = {g: float(stat(v)) for g, v in groups.items() if len(v) >= min_group}
    return {k: med[g] for k, g in key_of if g in med}


class ShapeMeanCost(LiveTimed):
    """LiveTimedCost with every matched step with prefill charged its shape group's mean / median."""

    medians: ClassVar[dict] = {}  # set per replay (main)

    def step_time(self, num_decode_seqs, num_prefill_tokens, num_context_tokens, prefill_chunks=None):
        t = super().step_time(num_decode_seqs, num_prefill_tokens, num_context_tokens, prefill_chunks)
        if self._matched and num_prefill_tokens:
            t = self.medians.get(self._key, t)
        return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-group", type=int, default=5)
    ap.add_argument("--stat", choices=("mean", "median"), default="mean")
    ap.add_argument("--state", action="store_true",
                    help="the groups split by the prefill-busy share of the 100 ms before the step (quarters): "
                         "the power state the cap model reads")
    a = ap.parse_args(argv)
    fs.LiveTimedCost = ShapeMeanCost  # replay_session imports it from the module at call time
    print("same prefill chunks, % of prefill steps (mean over the part's runs); live step times, each step "
          f"with prefill at its shape group's {a.stat} live time (groups of >= {a.min_group}"
          + (", split by the 100 ms prefill-busy share in quarters" if a.state else "") + "):")
    print(f"{'part':9s} {'steps':>6s} {'grouped':>8s}" + "".join(f"{ld:>8s}" for ld in LOADS) + "   0.95x per run   | live times"
          + "".join(f"{ld:>8s}" for ld in LOADS))
    out = {}
    for name, part in PARTS.items():
        tag = part.name
        val = json.loads((part / f"validate_{tag}.json").read_text())
        arr, batches = read_log(part / f"decisions_{tag}.jsonl.gz")
        rows = fs.read_steps(part / f"steps_{tag}.jsonl.gz")
        load_of = {a_.request_id: val["loads"][li]["load_label"]
                   for (_si, li), (ars, _b) in run_arrivals(val, arr, batches).items() for a_ in ars}
        busy = None
        if a.state:
            steps, _bad = fs.live_steps(rows, {a_.request_id: a_.max_tokens for a_ in arr})
            busy = [fs.busy_shares(steps, k, 0.1)[0] for k in range(len(steps))]
        med = shape_medians(rows, load_of, a.min_group, np.mean if a.stat == "mean" else np.median, busy)
        n_pf = sum(1 for r in rows if r["prefill"])
        res = {}
        for mode in ("shape", "live"):
            ShapeMeanCost.medians = med if mode == "shape" else {}
            r_ = replay_session(val, arr, batches, rows, str(part / f"profile_{tag}.json"), live_times=True,
                                gateway_loop=True, plan_lead="live")
            res[mode] = {ld["load_label"]: [r["steps_path"]["same_prefill_step_share"] for r in ld["runs"]]
                         for ld in r_["loads"]}
        out[name] = res
        print(f"{name:9s} {n_pf:6d} {len(med):8d}" + "".join(f"{100 * np.mean(res['shape'][ld]):8.1f}" for ld in LOADS)
              + "   " + " ".join(f"{100 * x:.1f}" for x in res["shape"]["0.95x"])
              + "   |           " + "".join(f"{100 * np.mean(res['live'][ld]):8.1f}" for ld in LOADS), flush=True)
    (HERE / f"shape_{a.stat}{'_state' if a.state else ''}.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
