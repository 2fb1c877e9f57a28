"""Issue 35, session 18 (H35G): an upper bound on what measuring the hull's outside would buy — the
replay (`validate_replay`'s default form: gateway loop on, plan lead live; the 33B FP8 s17 with
`--cap-by-power`, as it is scored) with ONLY a chosen subset of the live steps with prefill charged
their live time, every other step charged the model as usual.

How: `validate_replay.replay_session(live_times=True)` builds `fidelity_steps.LiveTimedCost`, which
charges every step with prefill whose chunks are a live step's that step's live time, and decode-only
steps the live ones'. `SubsetLiveCost` (patched in, `replay_session` imports the class at call time)
keeps only the subset's prefill steps (keys from `hull.py`: hull_keys_<part>.json.gz) and drops every
decode-only entry, so all else falls through to the inner model, power cap and idle launch included
(a matched step's cap factor and launch are 1 / 0: its live time holds them). With an empty subset
it is the default replay (the `none` rows; checked against the CLI's table in README).

    [STANDIN=d64] python whatif.py PART SUBSET [SUBSET ...]     PART: 6.7b-fp8_s16 | 33b-fp8_s17
        STANDIN=d64: with budget_point.py's stand-in profile (standin_profile_<part>_d64.json: the
        budget-filling packed point added at the live packed steps' level) instead of the part's own
        SUBSET: none | outside | inside | packed | d>dmax | prefix1 | prefix+k ... (hull.py's
                reasons) | packed_x (PACKED_X)  -> whatif_<part>_<subset>.json / .md (fidelity_table)
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from hull import CAP_BY_POWER, PARTS, part_files

import bench.simulator.fidelity_steps as fs
from bench.simulator.fidelity_steps import read_steps
from bench.simulator.validate import _default
from bench.simulator.validate_replay import replay_session
from scheduler.decisions import read_log

SUBSET: set = set()  # the chunk keys (frozensets of (request, tokens, start)) charged live
# "packed_x": no step live; instead every simulated step of the packed shape (d > 0, p > 1,024) is
# charged the model times live / model of the part's packed bin (hull.txt), whether or not the
# simulator formed a live step's chunks: the same bound without relying on the schedules agreeing
PACKED_X = {"6.7b-fp8_s16": 1 / 0.9353, "33b-fp8_s17": 1 / 1.0113}
SCALE = {"factor": 1.0}
COSTS: list = []  # each run's cost (its num_matched: the subset's steps the simulator formed)


class SubsetLiveCost(fs.LiveTimedCost):
    """`LiveTimedCost` on the subset's steps with prefill only; every other step the inner model
    (times SCALE's factor at the packed shape)."""

    def __init__(self, inner, live_ids, rows):
        super().__init__(inner, live_ids, rows)
        self.prefill = {k: v for k, v in self.prefill.items() if k in SUBSET}
        self.after, self.decode = {}, {}
        COSTS.append(self)

    def step_time(self, num_decode_seqs, num_prefill_tokens, num_context_tokens, prefill_chunks=None):
        t = super().step_time(num_decode_seqs, num_prefill_tokens, num_context_tokens, prefill_chunks)
        if num_decode_seqs > 0 and num_prefill_tokens > 1024 and not self._matched:
            t *= SCALE["factor"]
        return t


def main(argv: list[str]) -> int:
    name, subsets = argv[0], argv[1:]
    f = part_files(PARTS[name])
    val = json.loads(f["validate"].read_text())
    arr, batches = read_log(f["decisions"])
    rows = read_steps(f["steps"])
    with gzip.open(HERE / f"hull_keys_{name}.json.gz", "rt") as fh:
        keys = json.load(fh)
    fs.LiveTimedCost = SubsetLiveCost
    standin = os.environ.get("STANDIN")
    prof = HERE / f"standin_profile_{name}_{standin}.json" if standin else f["profile"]
    tag = f"_standin_{standin}" if standin else ""
    for sub in subsets:
        SUBSET.clear()
        COSTS.clear()
        SCALE["factor"] = PACKED_X[name] if sub == "packed_x" else 1.0
        if sub not in ("none", "packed_x"):
            SUBSET.update(frozenset((r, n, st) for r, n, st in k) for k in keys[sub])
        res = replay_session(val, arr, batches, rows, str(prof), cap_by_power=CAP_BY_POWER[name],
                             gateway_loop=True, plan_lead="live", live_times=True)
        matched = sum(c.num_matched for c in COSTS)
        print(f"terms {res['profile']['model_terms']}, lead {res['profile']['async_plan_lead_ms']}", flush=True)
        res["whatif_live_subset"] = {"subset": sub, "num_steps": len(SUBSET), "num_matched": matched,
                                     "packed_factor": SCALE["factor"]}
        out = HERE / f"whatif_{name}{tag}_{sub.replace('>', 'gt')}.json"
        out.write_text(json.dumps(res, indent=1, default=_default) + "\n")
        md = subprocess.run([sys.executable, "-m", "bench.simulator.fidelity_table", str(out)], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
        out.with_suffix(".md").write_text(md)
        for ld in res["loads"]:
            s = ld["summary_replay_path"]
            sc = ld["steps_path"].get("same_prefill_step_share", {})
            print(f"{name}{tag} {sub:8s} ({len(SUBSET):4d} steps live, {matched} charged live) "
                  f"{ld['load_label']:>6}: " + ", ".join(
                f"{m} {100 * s[m]['rel_err']['mean']:+.1f} ± {100 * s[m]['rel_err']['ci']:.1f}"
                for m in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99"))
                + f"; same chunks {100 * sc.get('mean', float('nan')):.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
