"""The engine's own step times while it serves (`tidegate backend --step-log PATH`).

One record per worker step: when it started (wall clock, so that a benchmark can cut the log at
its workloads' start and end times), how long the step took on the worker's loop (schedule,
launch, device, read-back and update: the cadence a stream of tokens sees), how many decodes it
carried and how many prefill tokens in how many chunks. Records stay in memory (four numbers a
step) and are written as JSON lines when the backend stops, so logging costs the loop no I/O.
"""
from __future__ import annotations

import json
from pathlib import Path

from scheduler.step_plan import StepPlan


class StepLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[tuple[float, float, int, int, int]] = []

    def record(self, start_wall_s: float, duration_s: float, plan: StepPlan) -> None:
        # prefill chunks come after the decodes in a plan: walk them from the end
        num_prefill_tokens = num_prefill_chunks = 0
        for chunk in reversed(plan.chunks):
            if not chunk.is_prefill:
                break
            num_prefill_tokens += len(chunk.token_ids)
            num_prefill_chunks += 1
        num_decodes = len(plan.chunks) - num_prefill_chunks + plan.num_unlisted_decodes
        self.rows.append((start_wall_s, duration_s, num_decodes, num_prefill_tokens,
                          num_prefill_chunks))

    def write(self) -> int:
        """Write every record (one JSON object a line); returns how many."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w") as fh:
            fh.writelines(json.dumps({"t": round(t, 6), "ms": round(dt * 1000, 4), "decodes": d,
                                     "prefill_tokens": p, "prefill_chunks": k}) + "\n" for t, dt, d, p, k in self.rows)
        return len(self.rows)


def read_step_log(path: str | Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]
