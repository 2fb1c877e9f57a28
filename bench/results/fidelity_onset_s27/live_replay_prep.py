"""Issue 35, session 27: a window of a grid part's live steps as compositions for
`python -m bench.engine.replay_live` (each step's decode contexts and prefill chunks, rebuilt from the
step and decision logs: `fidelity_steps.live_steps`), with each step's live device ms and the cost
model's charge at its live history (the part's validate terms, as `history_bins.py`'s "spells" form).

    python bench/results/fidelity_onset_s27/live_replay_prep.py PART_DIR OUT.json [N] [FROM]

N steps with prefill (default 200) from the first past the fraction FROM of the log (default 0.4:
inside the runs, past the warm-up), each with the decode-only step before it, in the live order.
"""
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h200_s20/analysis"))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_spread_s19"))
import prefill_bins

from bench.simulator import fidelity_steps
from sims.profile_cost import ProfileCost


def build(part: Path, spread):
    tag = part.name
    terms = dict(json.loads((part / f"validate_{tag}.json").read_text())["profile"]["model_terms"])
    terms["cap_by_power"] = True
    return ProfileCost.from_json(part / f"profile_{tag}.json", **terms, decode_spread=spread), terms


def main(part: Path, out: Path, n: int = 200, frac: float = 0.4) -> None:
    prefill_bins.build = build
    steps, bad, cost, _terms = prefill_bins.load(part)
    with gzip.open(part / f"steps_{part.name}.jsonl.gz", "rt") as fh:
        rows = [json.loads(x) for x in fh]
    if len(rows) != len(steps):
        raise SystemExit(f"{len(rows)} log rows against {len(steps)} rebuilt steps")
    model = {i: t for i, t, _f in fidelity_steps.model_step_ms(cost, steps)}
    lo = int(frac * len(steps))
    lo = next(i for i in range(lo, len(steps)) if steps[i]["p"])
    def ok(i: int) -> bool:
        s = steps[i]
        # a rebuild mismatch (decodes the logs do not pin) is left out
        return bool(s["d"] or s["p"]) and "device_ms" in rows[i] and i in model and len(s["ctxs"]) == s["d"]

    sel, num_pre = [], 0
    for i in range(lo, len(steps)):
        # every step with prefill, and the decode-only step before each (the live order kept)
        if not steps[i]["p"] or not ok(i):
            continue
        for j in (i - 1, i):
            if ok(j) and (not sel or sel[-1]["i"] < j):
                s = steps[j]
                sel.append({"i": j, "d": s["d"], "p": s["p"], "ctxs": s["ctxs"], "chunks": s["chunks"],
                            "live_device_ms": rows[j]["device_ms"], "model_ms": round(model[j], 4),
                            "idle_before": s["idle_before"]})
        num_pre += 1
        if num_pre == n:
            break
    doc = {"source": str(part.resolve().relative_to(ROOT)), "rebuild_mismatches": bad, "steps": sel}
    out.write_text(json.dumps(doc) + "\n")
    kinds = {"decode-only": sum(not x["p"] for x in sel), "with prefill": sum(bool(x["p"]) for x in sel)}
    print(f"{len(sel)} steps from step {lo} of {len(steps)} ({kinds}) -> {out}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), *(int(sys.argv[3]),) if len(sys.argv) > 3 else (),
         *(float(sys.argv[4]),) if len(sys.argv) > 4 else ())
