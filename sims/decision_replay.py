"""Replay a recorded arrival trace through the simulator and record its batching decisions.

The live gateway's `--decision-log` (scheduler.decisions) writes each arrival (id, time, prompt
length, max_tokens, class) and each flushed window. `replay` turns the arrivals into a
`Workload` (output length = max_tokens: the replay cannot know where EOS came), runs the event
loop with `record_batches` on, and answers the simulator's windows as the same `BatchRecord`s,
with the live request ids, so that `bench.simulator.decision_fidelity.compare` can set them side by side.

Arrival times are kept as recorded (the gateway's clock, not shifted to zero): the window
deadlines are `arrival + size / rate`, and the same floats on both sides give the same deadlines
to the last bit, which is what makes the deterministic part of the comparison exact.

What is deterministic: with idle flush off (`BatcherConfig.idle_flush=False`) and no flush held
for lack of backend slots, a window's membership depends only on the arrivals and the batcher
settings, so live and replay must agree exactly. With idle flush on, both sides flush when a
backend holds none of the gateway's requests (the same rule; `EventLoop.spare`), but when that
happens depends on step times: the live engine's and the cost model's differ, and the comparison
measures by how much. The arrival times are the pushes into the batcher (`Dispatcher.submit`),
which is where the simulator pushes them too.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from scheduler.decisions import ArrivalRecord, BatchRecord, StepRecord
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost, CostModel
from sims.event_loop import EngineConfig, SimResult, simulate
from sims.workload import Workload


def workload_from_arrivals(arrivals: Sequence[ArrivalRecord], forced: bool = False,
                           backends: Mapping[str, int] | None = None) -> Workload:
    """The recorded arrivals as a Workload (in arrival order; the class as the gateway chose it).
    `forced`: the simulator's admission follows the live decisions (its own still recorded);
    `backends` (live id -> the backend the live gateway sent it to, as the simulator numbers
    them): its placement follows them too (requests not named: its own)."""
    arrivals = sorted(arrivals, key=lambda a: a.t)  # stable: ties keep the gateway's order
    n = len(arrivals)
    return Workload(
        arrival_time=np.array([a.t for a in arrivals], dtype=np.float64),
        prompt_len=np.array([a.num_prompt_tokens for a in arrivals], dtype=np.int64),
        output_len=np.array([max(1, a.max_tokens) for a in arrivals], dtype=np.int64),
        prefix_group=np.full(n, -1, dtype=np.int64), prefix_len=np.zeros(n, dtype=np.int64),
        queue_class=np.array([a.queue_class for a in arrivals], dtype=np.int64),
        priority=np.zeros(n, dtype=np.int64),
        # the requests' own TTFT targets (probes carry one), which the live admission used
        ttft_override_ms=([a.slo_ttft_ms for a in arrivals]
                          if any(a.slo_ttft_ms is not None for a in arrivals) else None),
        forced_refused=[a.refused for a in arrivals] if forced else None,
        forced_backend=([backends.get(a.request_id, -1) for a in arrivals]
                        if backends is not None else None))


def replay(arrivals: Sequence[ArrivalRecord], sched_config: SimSchedulerConfig,
           cost: CostModel | None = None, engine: EngineConfig | None = None
           ) -> list[BatchRecord]:
    """The simulator's flushed windows for these arrivals, as BatchRecords with the live ids.

    `cost` defaults to a 10 ms constant step (it matters only through idle flush); `engine`
    defaults to one backend; `record_batches` is forced on."""
    return replay_run(arrivals, sched_config, cost, engine)[1]


def replay_run(arrivals: Sequence[ArrivalRecord], sched_config: SimSchedulerConfig,
               cost: CostModel | None = None, engine: EngineConfig | None = None,
               record_steps: bool = False, forced: bool = False,
               backends: Mapping[str, int] | None = None
               ) -> tuple[SimResult | None, list[BatchRecord]]:
    """`replay`, with the simulation's result too (for its latency figures; None: no arrivals).
    `record_steps`: every step is simulated alone and recorded (`step_records` reads them).
    `forced`: admission follows the live log's decisions, so that the simulator's own decision
    at each arrival (`refused_ids`) is taken in the state the live decisions made: how far the
    inputs differ, apart from the cascade of one differing decision through the rest.
    `backends`: the live placement (request id -> backend) to follow as well, where known (the
    decision log does not record it; a trace of the Batches sent does): then each decision is
    taken on the backends' states the live placement made, as placement by predicted TTFT
    breaks its near-ties by a load in tokens that one finish read a step apart flips."""
    if not arrivals:
        return None, []
    ordered = sorted(arrivals, key=lambda a: a.t)
    workload = workload_from_arrivals(ordered, forced, backends)
    engine = engine or EngineConfig(num_samples=1)
    engine = replace(engine, record_batches=True)
    if record_steps:
        engine = replace(engine, record_steps=True, max_stretch_steps=1)
    result = simulate(workload, cost or ConstantCost(0.010, num_blocks=1 << 14), sched_config, engine)
    ids = [a.request_id for a in ordered]
    classes = result.queue_class.tolist()
    return result, [BatchRecord(float(t), tuple(ids[i] for i in batch),
                                tuple(classes[i] for i in batch))
                    for t, batch in result.extra["batches"]]


def refused_ids(result: SimResult, arrivals: Sequence[ArrivalRecord]) -> set[str]:
    """The live ids of the arrivals the simulator's admission refused (scheduler.admission)."""
    ids = [a.request_id for a in sorted(arrivals, key=lambda a: a.t)]
    return {ids[i] for i in result.extra.get("retry_after_s", {})}


def predictions_ms(result: SimResult, arrivals: Sequence[ArrivalRecord]
                   ) -> dict[str, tuple[float, float]]:
    """Per live id: the simulator's admission prediction and margin at its arrival, ms."""
    ids = [a.request_id for a in sorted(arrivals, key=lambda a: a.t)]
    return {ids[i]: (p * 1e3, m * 1e3)
            for i, (p, m) in result.extra.get("admission_predictions", {}).items()}


def step_records(result: SimResult, arrivals: Sequence[ArrivalRecord], backend: int = 0
                 ) -> list[StepRecord]:
    """One backend's simulated steps (`replay_run(..., record_steps=True)`) as StepRecords with
    the live request ids (`arrivals` as given to replay_run)."""
    ids = [a.request_id for a in sorted(arrivals, key=lambda a: a.t)]
    return [StepRecord(float(t), int(d), tuple((ids[i], int(n), int(p)) for i, n, p in chunks),
                       tuple(ids[i] for i in pre))
            for t, b, d, chunks, pre in result.extra["steps"] if b == backend]
