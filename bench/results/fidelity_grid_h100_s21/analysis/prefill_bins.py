"""Issue 35, session 20: a grid part's steps with prefill binned by prefill tokens x decodes, and
split by their decodes' spread (max / mean context < 2 or >= 2): the cost model's time (the grid
state's model, as ../../fidelity_spread_s19/spread_bins.py builds it) against live.

    python prefill_bins.py PART_DIR [KAPPA|measured|off]
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_spread_s19"))
from spread_bins import build

from bench.simulator import fidelity_steps
from scheduler.decisions import read_log

P_BINS = ((1, 128), (129, 256), (257, 512), (513, 1024), (1025, 4096))
D_BINS = ((0, 0), (1, 8), (9, 32), (33, 64), (65, 256))


def spread(s: dict) -> float:
    return max(s["ctxs"]) / (sum(s["ctxs"]) / len(s["ctxs"])) if s["d"] >= 2 else 1.0


def load(part: Path, spread: str = "measured"):
    """A part's live steps (rebuilt from its logs), rebuild mismatches, the grid state's cost model
    and its terms: what every script of this folder starts from."""
    tag = part.name
    arr, _ = read_log(part / f"decisions_{tag}.jsonl.gz")
    steps, bad = fidelity_steps.live_steps(fidelity_steps.read_steps(part / f"steps_{tag}.jsonl.gz"),
                                           {a.request_id: a.max_tokens for a in arr})
    cost, terms = build(part, spread)
    return steps, bad, cost, terms


def main(argv: list[str], model_step_ms=None) -> None:
    part = Path(argv[0])
    tag = part.name
    steps, bad, cost, terms = load(part, argv[1] if len(argv) > 1 else "measured")
    res = {i: t for i, t, _f in (model_step_ms or fidelity_steps.model_step_ms)(cost, steps)}
    print(f"== {tag}: {len(steps)} steps, rebuild mismatches {bad}; terms {terms}")
    pre = [i for i, s in enumerate(steps) if s["p"] and i in res]

    def ratio(sel):
        return sum(res[i] for i in sel) / sum(steps[i]["ms"] for i in sel) if len(sel) >= 10 else float("nan")

    print(f"{'prefill tok':>12s} {'decodes':>8s} {'n':>6s} {'live ms':>8s} {'model/live':>10s}  spread<2  spread>=2")
    for plo, phi in P_BINS:
        for dlo, dhi in D_BINS:
            sel = [i for i in pre if plo <= steps[i]["p"] <= phi and dlo <= steps[i]["d"] <= dhi]
            if len(sel) < 15:
                continue
            live = sum(steps[i]["ms"] for i in sel)
            lo = [i for i in sel if spread(steps[i]) < 2]
            hi = [i for i in sel if spread(steps[i]) >= 2]
            print(f"{plo:5d}-{phi:<6d} {dlo:3d}-{dhi:<4d} {len(sel):6d} {live / len(sel):8.3f} "
                  f"{ratio(sel):10.4f}  {ratio(lo):8.4f} {ratio(hi):9.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
