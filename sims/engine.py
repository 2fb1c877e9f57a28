"""The discrete-event loop: workload → gateway (queues + batcher) → N backends → metrics.

Time lives in one `ManualClock`; the scheduler objects read it through the adapters, never the
loop's entities. Events are kept in a heap ``(time, seq, kind, arg)``; arrivals are not pushed but
read from the sorted workload arrays (the next event is the earlier of the two), which keeps the
heap small. Ties: a heap event at time t runs before an arrival at t, so a backend that frees up at
t is seen by the batcher's idle check for that arrival.

Backends::

      inbox (requests delivered during a step; admitted at the next step boundary)
        │
        ▼  start_step ──────────────── pure decode, nothing waiting, k = max_pure_decode_steps() ≥ 2?
     schedule()                          │ yes: one STRETCH event at the end of the k steps; a batch
        │ step_time(plan)                │ delivered meanwhile truncates it to the step in progress
        ▼                                ▼
     STEP event → update(result)      STRETCH event → advance_decode_steps(j)

A stretch's step times come from `CostModel.decode_times` (context grows by the batch each step);
its tokens are recorded as ITL samples (each step's duration weighted by the number of sequences).
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

import numpy as np

from scheduler.clock import ManualClock
from sims.adapters import BackendAdapter, GatewayAdapter, SimSchedulerConfig
from sims.cost import CostModel
from sims.workload import Workload

INF = math.inf
_STEP, _STRETCH, _TIMER, _DELIVER = 0, 1, 2, 3


@dataclass(frozen=True)
class EngineConfig:
    num_backends: int = 1
    network_delay_s: float = 0.0        # gateway -> backend one-way delay of a batch
    spare_kv_watermark: float = 0.9     # a backend is "spare" below this KV use with nothing waiting
    max_stretch_steps: int = 1 << 30    # cap on one k-step advance (1 disables stretches)
    num_samples: int = 2000             # time-series samples (queue depth, KV use) over the run
    progress: bool = False


@dataclass
class SimResult:
    """Raw outcome; `sims.report.summarize` turns it into the JSON report."""
    workload: Workload
    dispatch_time: np.ndarray          # batch flush time per request (NaN: never dispatched)
    first_token_time: np.ndarray
    finish_time: np.ndarray
    num_output: np.ndarray
    queue_class: np.ndarray
    rejected: np.ndarray               # bool: refused at the gateway or the backend
    itl_values: np.ndarray
    itl_weights: np.ndarray
    batch_sizes: np.ndarray            # gateway flushes
    step_decode: np.ndarray            # per step (stretches expanded): decode sequences
    step_prefill: np.ndarray           # per step: prefill tokens
    step_time: np.ndarray
    series: dict[str, np.ndarray]      # t, queue_depth, kv_usage, running
    backend_stats: list[dict]
    events: int
    wall_s: float
    sim_end: float
    extra: dict = field(default_factory=dict)


class _Backend:
    __slots__ = (
        "busy",
        "end_time",
        "idx",
        "inbox",
        "outstanding",
        "plan",
        "sched",
        "stretch_cum",
        "stretch_n",
        "stretch_start",
        "stretch_times",
        "version",
    )

    def __init__(self, idx: int, sched: BackendAdapter):
        self.idx, self.sched = idx, sched
        self.inbox: list[int] = []
        self.busy = False
        self.end_time = 0.0
        self.version = 0
        self.stretch_start = 0.0
        self.stretch_times = None
        self.stretch_cum = None
        self.stretch_n = 0
        self.plan = None
        self.outstanding = 0


def simulate(workload: Workload, cost: CostModel, sched_config: SimSchedulerConfig,
             config: EngineConfig = EngineConfig()) -> SimResult:
    wall0 = time.perf_counter()
    n = len(workload)
    clock = ManualClock(0.0)
    gateway = GatewayAdapter(sched_config, clock, workload)
    num_blocks = cost.num_kv_blocks(sched_config.block_size)
    backends = [_Backend(b, BackendAdapter(sched_config, num_blocks, workload))
                for b in range(config.num_backends)]

    arrival = workload.arrival_time
    prompt_len, output_len = workload.prompt_len, workload.output_len
    dispatch_t = np.full(n, np.nan)
    first_t = np.full(n, np.nan)
    finish_t = np.full(n, np.nan)
    rejected = np.zeros(n, dtype=bool)
    step_rows: list[tuple] = []        # (num_decode, num_prefill_tokens, duration) per single step
    stretch_rows: list[tuple] = []     # (num_decode, times array) per stretch
    batch_sizes: list[int] = []
    heap: list[tuple] = []
    seq = 0
    events = 0
    timer_deadline = INF
    watermark = config.spare_kv_watermark
    delay = config.network_delay_s
    max_k = config.max_stretch_steps
    horizon = float(arrival[-1]) if n else 0.0
    sample_dt = horizon / config.num_samples if horizon > 0 else INF
    next_sample = 0.0
    series: dict[str, list] = {"t": [], "queue_depth": [], "kv_usage": [], "running": [],
                               "fragmentation": []}
    step_time_fn = cost.step_time
    decode_times_fn = cost.decode_times
    progress_every = max(1, n // 50)
    next_progress = progress_every

    def spare() -> bool:
        for be in backends:
            s = be.sched
            if not be.inbox and s.num_waiting == 0 and s.kv_usage < watermark and s.has_room:
                return True
        return False

    def dispatch(now: float) -> None:
        nonlocal seq
        batch = gateway.take_batch()
        if not batch:
            return
        batch_sizes.append(len(batch))
        be = min(backends, key=lambda x: x.outstanding)
        for i in batch:
            dispatch_t[i] = now
            be.outstanding += int(prompt_len[i] + output_len[i])
        if delay > 0:
            seq += 1
            heapq.heappush(heap, (now + delay, seq, _DELIVER, (be.idx, batch)))
        else:
            deliver(be, batch, now)

    def deliver(be: _Backend, batch: list[int], now: float) -> None:
        nonlocal seq
        be.inbox.extend(batch)
        if not be.busy:
            start_step(be, now)
        elif be.stretch_times is not None:
            # truncate the stretch after the step in progress at `now`
            j = int(np.searchsorted(be.stretch_cum, now - be.stretch_start, side="right")) + 1
            if j < len(be.stretch_times):
                be.stretch_times = be.stretch_times[:j]
                be.end_time = be.stretch_start + float(be.stretch_cum[j - 1])
                be.version += 1
                seq += 1
                heapq.heappush(heap, (be.end_time, seq, _STRETCH, (be.idx, be.version)))

    def admit(be: _Backend, now: float) -> None:
        sched = be.sched
        for i in be.inbox:
            if not sched.add(i, now):
                rejected[i] = True
                be.outstanding -= int(prompt_len[i] + output_len[i])
        be.inbox.clear()

    def start_step(be: _Backend, now: float) -> None:
        nonlocal seq
        if be.inbox:
            admit(be, now)
        sched = be.sched
        if max_k > 1 and sched.num_waiting == 0:
            k, num_decode, num_ctx = sched.max_pure_decode_steps()
            if k > 1:
                k = min(k, max_k)
                times = decode_times_fn(num_decode, num_ctx, k)
                be.stretch_times, be.stretch_cum = times, np.cumsum(times)
                be.stretch_start, be.stretch_n = now, num_decode
                be.busy = True
                be.end_time = now + float(be.stretch_cum[-1])
                be.version += 1
                seq += 1
                heapq.heappush(heap, (be.end_time, seq, _STRETCH, (be.idx, be.version)))
                return
        plan = sched.schedule()
        if plan is None:
            be.busy = False
            return
        num_decode, num_prefill, num_ctx = plan
        dt = step_time_fn(num_decode, num_prefill, num_ctx)
        step_rows.append((num_decode, num_prefill, dt))
        be.busy = True
        be.plan = plan
        be.end_time = now + dt
        seq += 1
        heapq.heappush(heap, (be.end_time, seq, _STEP, be.idx))

    def finish_requests(be: _Backend, done: list[int], now: float) -> None:
        for i in done:
            finish_t[i] = now
            be.outstanding -= int(prompt_len[i] + output_len[i])

    def after_step(be: _Backend, now: float) -> None:
        start_step(be, now)
        if gateway.num_pending and gateway.idle_flush:
            set_timer(now)  # the backend's new load may allow an idle flush

    def handle(dec, now: float) -> None:
        """Act on a batcher decision: flush while due, then arm the one timer."""
        nonlocal seq, timer_deadline
        while dec.flush_now:
            dispatch(now)
            dec = gateway.poll(spare())
        deadline = dec.deadline
        if deadline is None:
            timer_deadline = INF
        elif deadline != timer_deadline:
            timer_deadline = deadline
            seq += 1
            heapq.heappush(heap, (deadline, seq, _TIMER, deadline))

    def set_timer(now: float) -> None:
        handle(gateway.poll(spare()), now)

    i = 0
    now = 0.0
    while True:
        t_arr = arrival[i] if i < n else INF
        if heap and heap[0][0] <= t_arr:
            now, _, kind, arg = heapq.heappop(heap)
            clock.set(now)
            events += 1
            if kind == _STEP:
                be = backends[arg]
                plan, be.plan = be.plan, None
                firsts, done = be.sched.complete_step(plan)
                for r in firsts:
                    if first_t[r] != first_t[r]:  # NaN: not a re-prefill after preemption
                        first_t[r] = now
                finish_requests(be, done, now)
                after_step(be, now)
            elif kind == _STRETCH:
                b, version = arg
                be = backends[b]
                if version != be.version:
                    continue
                times = be.stretch_times
                be.stretch_times = be.stretch_cum = None
                stretch_rows.append((be.stretch_n, times))
                done = be.sched.advance(len(times))
                finish_requests(be, done, now)
                after_step(be, now)
            elif kind == _TIMER:
                if arg != timer_deadline:
                    continue
                timer_deadline = INF
                set_timer(now)
            else:  # _DELIVER
                b, batch = arg
                deliver(backends[b], batch, now)
        elif i < n:
            now = float(t_arr)
            clock.set(now)
            events += 1
            dec = gateway.push(i, now, spare())
            if dec.rejected is not None:
                rejected[i] = True
            i += 1
            handle(dec, now)
            if config.progress and i >= next_progress:
                next_progress += progress_every
                _progress(i, n, wall0)
        else:
            break
        if now >= next_sample:
            next_sample = now + sample_dt
            series["t"].append(now)
            series["queue_depth"].append(gateway.num_pending + sum(len(b.inbox) + b.sched.num_waiting
                                                                   for b in backends))
            series["kv_usage"].append(sum(b.sched.kv_usage for b in backends) / len(backends))
            series["running"].append(sum(b.sched.num_running for b in backends))
            series["fragmentation"].append(
                sum(b.sched.fragmentation() for b in backends) / len(backends))
    if config.progress:
        _progress(n, n, wall0, end="\n")

    # Expand per-step records: single steps and stretches.
    sd = [np.array([r[0] for r in step_rows], dtype=np.int64)]
    sp = [np.array([r[1] for r in step_rows], dtype=np.int64)]
    st = [np.array([r[2] for r in step_rows], dtype=np.float64)]
    for num, times in stretch_rows:
        sd.append(np.full(len(times), num, dtype=np.int64))
        sp.append(np.zeros(len(times), dtype=np.int64))
        st.append(times)
    step_decode, step_time = np.concatenate(sd), np.concatenate(st)
    # ITL: every sequence decoding in a step waited that step's duration for its token.
    itl_values, itl_weights = step_time, step_decode.astype(np.float64)
    return SimResult(
        workload=workload, dispatch_time=dispatch_t, first_token_time=first_t, finish_time=finish_t,
        num_output=output_len.copy(), queue_class=gateway.classes(), rejected=rejected,
        itl_values=itl_values, itl_weights=itl_weights,
        batch_sizes=np.array(batch_sizes, dtype=np.int64),
        step_decode=step_decode, step_prefill=np.concatenate(sp), step_time=step_time,
        series={k: np.array(v) for k, v in series.items()},
        backend_stats=[b.sched.stats() for b in backends], events=events,
        wall_s=time.perf_counter() - wall0, sim_end=now,
        extra={"num_kv_blocks": num_blocks})


def _progress(done: int, total: int, wall0: float, end: str = "") -> None:
    import sys
    width = 30
    frac = done / total if total else 1.0
    bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
    sys.stderr.write(f"\r[{bar}] {done}/{total} requests  {time.perf_counter() - wall0:.1f}s{end}")
    sys.stderr.flush()
