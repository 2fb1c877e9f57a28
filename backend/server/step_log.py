"""The engine's own step times while it serves (`tidegate backend --step-log PATH`).

One record per worker step: when it started (wall clock, so that a benchmark can cut the log at
its workloads' start and end times), how long the step took on the worker's loop (from the later
of its planning and the previous step's read-back to its own read-back: the cadence a stream of
tokens sees; with async scheduling, back-to-back steps' device time), how many decodes it
carried and how many prefill tokens in how many chunks — and which: each prefill chunk as
(request id, tokens, first position) and the ids preempted, the fields of
`scheduler.decisions.StepRecord`, so that the simulator's steps can be compared with these
(issue 18). Records stay in memory and are written as JSON lines when the backend stops, so
logging costs the loop no I/O; with the log off, nothing is recorded.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from scheduler.step_plan import StepPlan


class StepLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[tuple] = []

    def record(self, start_wall_s: float, duration_s: float, plan: StepPlan,
               device_s: float | None = None, device_idle_s: float | None = None,
               host_phases: tuple | None = None) -> None:
        """`device_s`: the step's own device time (CUDA timing events), when known: a step's
        duration here is the read-back cadence, which also holds any time the device waited.
        `device_idle_s`: how long the device sat idle between the step before and this one
        (the same events), when known. `host_phases`: seconds of its planning, its launch's
        host work, launch to read-back and its handling after the read-back
        (`InFlightStep.host_phases`), when known: a drafting step has no timing events, and
        these tell its host's part from its device's (issue 28)."""
        # prefill chunks come after the decodes in a plan: walk them from the end
        prefill = []
        for chunk in reversed(plan.chunks):
            if not chunk.is_prefill:
                break
            prefill.append((_request_id(chunk.request_id), len(chunk.token_ids), chunk.start_pos))
        prefill.reverse()
        # draft tokens verified in this step (speculative decoding); 0 for most steps
        drafts = sum(getattr(c, "num_draft", 0) for c in plan.chunks)
        num_decodes = len(plan.chunks) - len(prefill) + plan.num_unlisted_decodes
        # the start on the monotonic clock too (the clock of the gateway's decision log and of
        # bench's records on Linux), so a request's path can be followed across the processes
        self.rows.append((start_wall_s, time.monotonic() - duration_s, duration_s, num_decodes,
                          prefill, [_request_id(r) for r in plan.preempted], device_s, drafts,
                          device_idle_s, host_phases))

    def write(self) -> int:
        """Write every record (one JSON object a line); returns how many."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w") as fh:
            fh.writelines(json.dumps({"t": round(t, 6), "mono": round(m, 6), "ms": round(dt * 1000, 4),
                                      "decodes": d, "prefill_tokens": sum(c[1] for c in p),
                                      "prefill_chunks": len(p), "prefill": p, "preempted": pre}
                                     | ({} if dev is None else {"device_ms": round(dev * 1000, 4)})
                                     | ({} if idle is None else
                                        {"device_idle_ms": round(idle * 1000, 4)})
                                     | ({"drafts": k} if k else {})
                                     | ({} if hp is None else
                                        {"host_ms": [round(x * 1000, 4) for x in hp]}))
                          + "\n" for t, m, dt, d, p, pre, dev, k, idle, hp in self.rows)
        return len(self.rows)


def _request_id(key: str) -> str:
    """The gateway's request id of an engine key ("<gateway identity hex>/<request id>", as the
    worker names requests); a key without an identity is returned as it is."""
    return key.split("/", 1)[1] if "/" in key else key


def read_step_log(path: str | Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]
