"""Issue 35, session 29: a contiguous window of a grid part's live steps (every kind, in the live order) as
compositions for `python -m bench.engine.replay_live`, each with its live device ms and the profile's raw
charge (no terms) at its shape, to answer whether the live decode-only steps' excess at d off the powers of 2
(`decode_exact.py`: 1.015-1.03 against ~1.00 at d 8 / 16 / 32) is in the compositions (their unequal contexts)
or only live (the engine's own block tables, inputs and process): replay_live lays tables out contiguous.

    python bench/results/fidelity_h100fp8_s29/decode_replay_prep.py PART_DIR OUT.json [N] [FROM]

N steps (default 700) from the fraction FROM of the log (default 0.3). Read the replay with
`decode_replay_read.py`. A step log without CUDA timing events (the CPU check of
scripts/gpu_decode_same_machine.sh) gives its steps' wall ms as their live time, so the tool runs there too.
"""
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h100_s21/analysis"))
from prefill_bins import load


def main(part: Path, out: Path, n: int = 700, frac: float = 0.3) -> None:
    steps, _bad, cost, _terms = load(part)
    with gzip.open(part / f"steps_{part.name}.jsonl.gz", "rt") as fh:
        rows = [json.loads(x) for x in fh]
    rows = [r for r in rows if "mono" in r]
    if len(rows) != len(steps):
        raise SystemExit(f"{len(rows)} log rows against {len(steps)} rebuilt steps")
    lo = int(frac * len(steps))
    timed = any("device_ms" in r for r in rows)  # else the CPU: no device times at all
    sel = []
    for i in range(lo, len(steps)):
        s = steps[i]
        live_ms = rows[i].get("device_ms", None if timed else rows[i]["ms"])
        if not (s["d"] or s["p"]) or live_ms is None or len(s["ctxs"]) != s["d"]:
            if sel:
                break  # keep the window contiguous: the live order is what the pipelined pass replays
            continue
        raw = 1e3 * cost.step_time(s["d"], 0, s["ctx"]) if not s["p"] else None
        sel.append({"i": i, "d": s["d"], "p": s["p"], "ctxs": s["ctxs"], "chunks": s["chunks"],
                    "live_device_ms": live_ms, "raw_model_ms": raw, "idle_before": s["idle_before"]})
        if len(sel) == n:
            break
    src = part.resolve()  # relative to the repo where it lies inside it (a device call's part lies outside)
    src = src.relative_to(ROOT) if src.is_relative_to(ROOT) else src
    out.write_text(json.dumps({"source": str(src), "steps": sel}) + "\n")
    if not sel:
        raise SystemExit(f"no step of {part} could be replayed")
    print(f"{len(sel)} steps from step {sel[0]['i']} of {len(steps)}: "
          f"{sum(not x['p'] for x in sel)} decode-only -> {out}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), *(int(sys.argv[3]),) if len(sys.argv) > 3 else (),
         *(float(sys.argv[4]),) if len(sys.argv) > 4 else ())
