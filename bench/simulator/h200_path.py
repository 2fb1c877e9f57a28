"""The H200 session's live path outside the simulator, from its logs (issue 18; no device time).

That run's step log predates the step records' ids and `mono` field: each row has a wall-clock
start and its prefill chunk count. Requests are admitted in flush order (FIFO, one chunk each:
512 <= the 2048-token budget, no preemptions), so the k-th prefill chunk of the step log is the
k-th request flushed. The wall - monotonic offset is taken as the smallest (step start - flush)
over all requests (a batch reaching an idle backend: the wire time only, ~0.1-0.3 ms, which this
leaves in the offset). Then per run:

    modelled   = median over requests of (end of its prefill step - its push)     [what the sim has]
    unmodelled = live client TTFT P50 - modelled                                  [HTTP in + out]

    python -m bench.simulator.h200_path bench/results/fidelity_h200
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scheduler.decisions import read_log


def main(res: str) -> int:
    res_dir = Path(res)
    validate = json.loads((res_dir / "validate_33b.json").read_text())
    arrivals, batches = read_log(str(res_dir / "decisions_33b.jsonl.gz"))
    with gzip.open(res_dir / "steps_33b.jsonl.gz", "rt") as fh:
        rows = [json.loads(x) for x in fh if x.strip()]
    push = {a.request_id: a.t for a in arrivals}
    order = [rid for b in sorted(batches, key=lambda b: b.t) for rid in b.request_ids]
    flush = {rid: b.t for b in batches for rid in b.request_ids}
    chunks = [(r["t"], r["t"] + r["ms"] / 1e3) for r in rows for _ in range(r["prefill_chunks"])]
    if len(chunks) != len(order):
        print(f"{len(chunks)} prefill chunks for {len(order)} requests: not one chunk each")
        return 1
    offset = min(s - flush[rid] for (s, _), rid in zip(chunks, order, strict=True))
    end = {rid: e - offset for (_, e), rid in zip(chunks, order, strict=True)}
    cfg = validate["config"]
    n, warm = cfg["num_requests"], cfg["warmup_requests"]
    ids = [a.request_id for a in sorted(arrivals, key=lambda a: a.t)][warm:]
    print(f"{'load':>6} {'seed':>4} {'live TTFT p50':>14} {'modelled p50':>13} {'unmodelled':>11}")
    k = 0
    by_load: dict[str, list[float]] = {}
    for seed_i, _ in enumerate(cfg["seeds"].split(",")):
        for ld in validate["loads"]:
            run = ids[k * n:(k + 1) * n]
            k += 1
            modelled = float(np.median([1e3 * (end[r] - push[r]) for r in run]))
            live = ld["runs"][seed_i]["live"]["ttft_ms"]["p50"]
            print(f"{ld['load_label']:>6} {seed_i:>4} {live:>14.2f} {modelled:>13.2f} {live - modelled:>11.2f}")
            by_load.setdefault(ld["load_label"], []).append(live - modelled)
    print("unmodelled, mean over seeds: " + ", ".join(f"{k} {np.mean(v):.2f} ms" for k, v in by_load.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/fidelity_h200"))
