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

A stretch runs past length finishes (up to `max_stretch_finishes` of them) when the backend has
room for more sequences and is below the spare watermark at its start (then a finish changes
nothing the gateway reads: the backend stays spare); otherwise it ends at the first finish. It
is kept as segments, one per batch size between finishes: ``(steps, batch, first context,
finishing at its end, cumulative end time)``; a segment's span is `CostModel.decode_span` (closed
form for the roofline), and the requests finishing inside get the exact end time of their last
step. Every step is recorded for the step and ITL figures (each step's duration weighted by the
number of sequences), expanded once at the end with `decode_step_times`.
"""
from __future__ import annotations

import gc
import heapq
import math
import time
from dataclasses import dataclass, field, replace
from functools import partial
from heapq import heappush

import numpy as np

from scheduler.clock import ManualClock
from scheduler.placement import PlacementConfig, PlacementItem
from scheduler.placements import create_placement
from scheduler.sessions import SessionInfo, chain_hashes, sampled_prefix
from sims.adapters import BackendAdapter, GatewayAdapter, HostTierCost, SimSchedulerConfig
from sims.cost import CostModel, decode_span_by_times
from sims.workload import Workload

INF = math.inf
_STEP, _STRETCH, _TIMER, _DELIVER, _READ = 0, 1, 2, 3, 4  # event kinds: EventLoop.loop's handlers
_GWJOB, _GWARR = 5, 6  # the gateway loop's model (EngineConfig.gateway_loop_*)


@dataclass(frozen=True)
class EngineConfig:
    num_backends: int = 1
    network_delay_s: float = 0.0        # gateway -> backend one-way delay of a batch
    # the variation of that delay, a centred sample (seconds): each Batch message's delay is
    # network_delay_s plus one draw from it (seeded by jitter_seed), and no message reaches its
    # backend before the one sent to it before (one connection delivers in order). Empty: every
    # message the same delay. A constant delay shifts a busy engine's whole timeline with its
    # arrivals and leaves the schedule as it is; its variation decides which side of a step's plan
    # an arrival lands (bench.simulator.schedule_ceiling: how alike two runs of one workload are)
    network_jitter_s: tuple[float, ...] = ()
    jitter_seed: int = 0
    # backend -> client delay of every token (read-back, wire, detokenizer, HTTP stream): added
    # to each request's first-token and finish times, so TTFT and E2E grow by it and TPOT does
    # not; measured live by bench.serving.ttft_path ("http_in" + "out"), ~4.5 ms on the H200 (issue 18)
    delivery_delay_s: float = 0.0
    # and this much more per stream of the step that produced the token: a first token (or a last
    # one) gets delivery_delay_s + delivery_per_stream_s x (the decodes + prefill chunks of its
    # step), the streams whose tokens the gateway and the client handle beside it. Live on the
    # H200 the path's `out` (step end -> the client's first token) grew ~70 us a stream on both
    # models (6.7B 0.50 + 0.073 ms x streams, 33B 0.87 + 0.069; issue 35). Client side only, as
    # delivery_delay_s (what the gateway hears is gateway_read_delay_s). 0: one constant
    delivery_per_stream_s: float = 0.0
    # a stretch may run past finishes only below this KV use (with room for more sequences)
    spare_kv_watermark: float = 0.9
    max_stretch_steps: int = 1 << 30    # cap on one k-step advance (1 disables stretches)
    max_stretch_finishes: int = 0       # finishing steps one stretch may pass (0: ends at the first)
    num_samples: int = 2000             # time-series samples (queue depth, KV use) over the run
    # backends read per sample: with more, each sample reads the next this-many in turn and
    # scales their sum (an estimate; exact up to this many backends) so sampling costs
    # O(samples), not O(samples x backends) — it was most of a 512-backend run's time
    max_backends_per_sample: int = 16
    progress: bool = False
    # which backend gets which request: the gateway's policy objects (scheduler.placement)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    report_interval_s: float = 0.1      # a busy backend's LoadReport period (prefix facts)
    # keep every flushed window, (time, request indices), in SimResult.extra["batches"]
    # (sims.decision_replay compares them with the live gateway's; off: no cost)
    record_batches: bool = False
    # every single step's composition (start, backend, decodes, prefill chunks as (request,
    # tokens, start position), preempted): `extra["steps"]`; stretches are recorded as one row
    # each, so set max_stretch_steps=1 to see every step (sims.decision_replay does)
    record_steps: bool = False
    # the engine's async loop (CUDA, backend.engine.continuous): each step is planned while the one before
    # it still runs, so a request delivered after that plan waits a step more. None: the
    # synchronous loop (CPU), planned at the step boundary. Otherwise a step's successor is
    # planned this long before its end (`Engine.launch_deadline`: twice the host's launch time
    # + 1 ms). On the H200 (33B, 0.8-0.95x) 55-60% of requests landed a step later than the
    # synchronous loop would put them (issue 18)
    async_plan_lead_s: float | None = None
    # the lead after a step carrying prefill, where it differs (None: async_plan_lead_s). Live on
    # the H200 6.7B (the step log's plan starts: end - its host phases) the engine planned 2.2 ms
    # before a decode-only step's read-back but 3.6 ms before a prefill step's (median; the
    # launch deadline reads the graph's last device time, which a power-capped prefill step
    # outruns), against the profile's 1.75 ms (issue 35)
    async_plan_lead_prefill_s: float | None = None
    # the lead as a line in the ending step's own duration, (a, b, lo, hi) after a decode-only step
    # and after a step with prefill: lead = a + b x duration held inside [lo, hi] (the range it was
    # measured over: a line is not extrapolated) and never past the step's start (None: the
    # constants above). Live
    # the lead grows with the step it plans behind (the step log, `bench.simulator.plan_lead`:
    # the 6.7B's 1.8 -> 2.7 ms over 5-12 ms decode-only steps, 2.6 -> 4.9-6.0 ms over 7-25+ ms
    # prefill steps, H100 and H200 alike), so one constant per kind put a request delivered late
    # in a long prefill step into the next step where the engine had planned it already (issue
    # 35, session 21). Needs max_stretch_steps=1 (a stretch's end is not one step's)
    async_plan_lead_line: tuple[tuple[float, float, float, float], ...] | None = None
    # whether a step carrying prefill tokens has that deadline too (the engine since the third
    # session: every graph-replayed step does). False models the engine before it, which
    # launched a prefill step's successor as soon as the prefill step started (the H200
    # fidelity runs recorded before then: bench.simulator.fidelity_resim)
    prefill_launch_deadline: bool = True
    # host CPU per Batch message (one flushed window's share for one backend), whatever its size:
    # the gateway's encode and send (serialized: one gateway process), and the backend's decode
    # and admission, added to the step that admits it. What a window saves: measured on the
    # 2-core CPU box at c=64 (BENCHMARKS, "the batching window at c=64"): ~350 us and ~250 us
    # per message; 0 (the default) models neither
    gateway_message_s: float = 0.0
    backend_message_s: float = 0.0
    # backend -> gateway delay of a step's outputs (the backend's send, the wire, the gateway's
    # read): the gateway learns of a first token or a finish this long after the step ends, and
    # not while its one thread is placing and sending a window (`gateway_message_s`: it reads
    # when the window's last Batch is out). What it learns then: the wait predictor's
    # started / finished (scheduler.admission), placement's release of the finished requests'
    # tokens and its count of requests in flight (idle flush). With it, the predictor's
    # dispatches are at their Batch's send, not at the flush (the live gateway calls
    # `dispatched` after each send). The clients' times are unchanged (`delivery_delay_s`).
    # 0 (the default): at the step's end, every dispatch at the flush. Measured on the 2-core
    # CPU box, 4 paced echo backends: step end -> the gateway's read of its first tokens p50
    # 1.1 ms, p10-p90 0.5-2.1 (issue 31, eighth session: G - E); a predictor that heard a
    # start the live one had not yet took other decisions (issue 31, ninth session)
    gateway_read_delay_s: float = 0.0
    # prefix pins (scheduler.block_manager): the most of each backend's KV blocks pins may hold
    pin_budget_fraction: float = 0.25
    # prefix pull between backends (issue 34, sims.kv_pull): a scheduler.kv_cost.PullConfig;
    # None: off (a request recomputes what its backend lacks)
    kv_pull: object = None
    num_prefill_backends: int = 0  # disaggregated Slow prefill there (sims.kv_pull; with kv_pull)
    # The gateway's one event loop as a single FIFO server (issue 35; off while all four are 0).
    # What occupies it: every step's outputs, `gateway_loop_per_stream_s` x the step's streams
    # (decodes + prefill chunks: the fan-out and each stream's SSE write), from
    # `gateway_loop_read_s` after the step's end; every arrival, `gateway_loop_request_s` (its
    # parse and push). What waits for it: a window's timer fires `gateway_timer_late_s` after its
    # deadline (the loop's own timer lateness, measured at idle: uvloop's timers are in whole ms)
    # and then only once the loop is free (asyncio runs a due timer after the callbacks already
    # ready: the token writes of the step being delivered); a request's first token leaves when
    # its step's job is done (its wait behind jobs still running is added to the delivery path,
    # which already holds read + per-stream x streams); and a request reaching the gateway while
    # the loop is busy: with `gateway_loop_arrivals` "wait" (the workload's times are the
    # clients' sends) it is pushed when the loop is free; with "recorded" (a replay: the times
    # are the live pushes, made after that wait) its TTFT is charged the loop's time-average
    # residual (what a Poisson arrival waits; PASTA). Measured on the H200 logs (bench.simulator
    # .gateway_loop): the 6.7B's window timer 0.5 ms late at idle and 0.8 / 1.2 / 1.4 ms mean at
    # 0.5 / 0.8 / 0.95x, deadlines 2-4 ms after a step's end 2.7 ms late at 0.95x
    gateway_loop_per_stream_s: float = 0.0
    gateway_loop_read_s: float = 0.0
    gateway_loop_request_s: float = 0.0
    gateway_timer_late_s: float = 0.0
    gateway_loop_arrivals: str = "wait"


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


def _session_info(workload: Workload, block_size: int, prompt_tokens, i: int,
                  now: float) -> SessionInfo:
    """Request i's session as the gateway would see it: its key, chain hashes and pin."""
    keys, pins = workload.session_keys, workload.pins
    pin_tokens, ttl = pins[i] if pins is not None else (0, 0.0)
    return SessionInfo(keys[i] if keys is not None else None,
                       chain_hashes(prompt_tokens(i), block_size),
                       pin_tokens // block_size if pin_tokens else 0, now + ttl if ttl else 0.0)


class _Backend:
    __slots__ = (
        "busy",
        "busy_s",
        "busy_since",
        "end_time",
        "idx",
        "inbox",
        "inbox_t",
        "last_report",
        "message_s",
        "multiples",
        "num_placed",
        "outstanding",
        "plan",
        "plan_prefill",
        "prefill_run_start",
        "prefill_spans",
        "released_early",
        "sched",
        "step_start",
        "streams",
        "stretch_past",
        "stretch_segs",
        "stretch_start",
        "tokens_placed",
        "version",
    )

    def __init__(self, idx: int, sched: BackendAdapter):
        self.idx, self.sched = idx, sched
        self.inbox: list[int] = []
        self.inbox_t: list[float] = []  # when each inbox request was delivered
        self.plan_prefill = False       # the step in progress carries prefill tokens
        # recent prefill steps (power cap): (start, end, weight in the busy share)
        self.prefill_spans: list[tuple[float, float, float]] = []
        # the start of the run of steps with prefill back to back that the last step belonged to, or None
        # (the delayed onset: sims.profile_cost, "The delayed onset")
        self.prefill_run_start: float | None = None
        self.busy = False
        self.end_time = 0.0
        self.version = 0
        self.stretch_start = 0.0
        self.stretch_segs = None    # [(steps, batch, context, num_finishing, cumulative end)]
        self.stretch_past = False
        # [what it was computed for, the multiple] of the decode batch's spread (slot 0,
        # EventLoop.spread_fn) and the mixed steps' (slot 1, mixed_spread_fn): _kept_multiple
        self.multiples = ([None, 1.0], [None, 1.0])
        self.plan = None
        self.streams = 0            # sequences of the single step in progress (delivery_per_stream_s)
        self.step_start = 0.0
        self.released_early = 0     # tokens of a stretch's past finishes released before its end
        self.busy_s = 0.0           # time spent in steps
        self.busy_since = 0.0       # start of the step that ended its last idle spell
        self.last_report = -INF
        self.message_s = 0.0        # host time of messages received, charged to the next step
        self.num_placed = 0         # requests placed here
        self.outstanding = 0        # placed here and not finished (the gateway's in-flight count)
        self.tokens_placed = 0      # their prompt + output tokens


def simulate(workload: Workload, cost: CostModel, sched_config: SimSchedulerConfig,
             config: EngineConfig = EngineConfig()) -> SimResult:
    return EventLoop(workload, cost, sched_config, config).run()


class EventLoop:
    """One simulation run: the state of the loop, and one handler per event kind
    (`on_step`, `on_stretch`, `on_timer`, `on_deliver`, and `on_arrival` for the workload)."""

    def __init__(self, workload: Workload, cost: CostModel, sched_config: SimSchedulerConfig,
                 config: EngineConfig) -> None:
        self.wall0 = time.perf_counter()
        self.workload, self.cost, self.config = workload, cost, config
        self.n = n = len(workload)
        self.clock = ManualClock(0.0)
        # "auto" prefix caching resolved once, not by each backend (a pass over the workload each)
        sched_config = replace(sched_config,
                               enable_prefix_caching=sched_config.prefix_caching_for(workload))
        self.gateway = gateway = GatewayAdapter(sched_config, self.clock, workload)
        self.num_blocks = num_blocks = cost.num_kv_blocks(sched_config.block_size)
        host = HostTierCost.for_cost_model(sched_config, cost)
        self.backends = backends = [
            _Backend(b, BackendAdapter(sched_config, num_blocks, workload, gateway.lists, host))
            for b in range(config.num_backends)]
        for be in backends:  # the deadline order's TTFT deadlines (None: off)
            be.sched.deadlines = gateway.deadlines

        # lists, not arrays, in the loop: a numpy scalar read or write costs ~80 ns more per access
        self.arrival = workload.arrival_time.tolist()
        # prompt + output
        self.num_tokens = (workload.prompt_len.astype(np.int64) + workload.output_len).tolist()
        nan = math.nan
        self.dispatch_t = [nan] * n
        self.first_t = [nan] * n
        self.finish_t = [nan] * n
        # the streams of each request's first-token and last-token steps (delivery_per_stream_s)
        self.per_stream = config.delivery_per_stream_s
        self.first_streams: list[int] | None = [0] * n if self.per_stream else None
        self.finish_streams: list[int] | None = [0] * n if self.per_stream else None
        self.rejected = np.zeros(n, dtype=bool)
        self.step_rows: list[tuple] = []     # (num_decode, num_prefill_tokens, duration) per single step
        self.stretch_rows: list[tuple] = []  # (steps, num_decode, first context) per stretch segment
        self.batch_sizes: list[int] = []
        self.batch_log: list[tuple[float, list[int]]] | None = [] if config.record_batches else None
        # with record_batches, also each request's backend and what the gateway hears of it
        # ((time, backend, request, 0: first token | 1: finish), in the order handled): what a
        # replay through the gateway's own code needs to make its decisions at the same state
        self.backend_of: list[int] | None = [-1] * n if config.record_batches else None
        self.request_log: list[tuple[float, int, int, int]] | None = (
            [] if config.record_batches else None)
        self.step_log: list[tuple] | None = [] if config.record_steps else None
        self.heap: list[tuple] = []
        self.seq = 0
        self.events = 0
        self.timer_deadline = INF
        self.watermark = config.spare_kv_watermark
        # backends holding none of the gateway's requests: what idle flush reads (spare())
        self.num_idle = config.num_backends
        self.delay = config.network_delay_s
        self.jitter = np.asarray(config.network_jitter_s, dtype=float) if config.network_jitter_s else None
        if self.jitter is not None:
            self.jitter_rng = np.random.default_rng(config.jitter_seed)
            self.last_delivery = [-INF] * config.num_backends
        self.gw_message_s, self.be_message_s = config.gateway_message_s, config.backend_message_s
        self.gw_free = 0.0  # when the gateway's one thread has sent every message so far
        if config.gateway_read_delay_s < 0.0:
            raise ValueError("gateway_read_delay_s must be >= 0")
        if config.gateway_read_delay_s > 0.0 and config.max_stretch_finishes:
            # a stretch past finishes releases their tokens early (release_stretch_finishes)
            raise ValueError("gateway_read_delay_s needs max_stretch_finishes=0")
        self.read_delay = config.gateway_read_delay_s
        # the gateway's event loop as one server (EngineConfig.gateway_loop_*)
        self.gl_stream, self.gl_read = config.gateway_loop_per_stream_s, config.gateway_loop_read_s
        self.gl_request, self.gl_late = config.gateway_loop_request_s, config.gateway_timer_late_s
        self.gl_on = bool(self.gl_stream or self.gl_request or self.gl_late)
        if config.gateway_loop_arrivals not in ("wait", "recorded"):
            raise ValueError("gateway_loop_arrivals must be 'wait' or 'recorded'")
        if self.gl_on and self.read_delay:
            raise ValueError("the gateway loop model and gateway_read_delay_s are exclusive")
        self.gl_recorded = config.gateway_loop_arrivals == "recorded"
        self.gl_free = 0.0            # when the loop is done with every job so far
        self.gl_period = (0.0, 0.0)   # the busy period in progress: (start, end)
        self.gl_area = 0.0            # integral of the residual (sum of closed periods' L^2 / 2)
        self.gl_t0 = self.gl_t1 = None  # the span the time average is over (first arrival..last job)
        self.gl_timer_held: float | None = None  # a due timer waiting for the loop (its deadline)
        self.gl_first_wait: list[float] | None = [0.0] * n if self.gl_on else None
        self.gl_pushed: set[int] = set()  # arrivals held for the loop ("wait"), now being pushed
        self.gl_finished = False      # the step just handled finished requests (on_capacity)
        if self.gl_on and config.max_stretch_steps != 1:
            raise ValueError("the gateway loop model needs max_stretch_steps=1 (a job per step)")
        self.forced_backend = workload.forced_backend
        self.pred_t: float | None = None  # the predictor's time while it notes a dispatch
        self.max_k = config.max_stretch_steps
        self.plan_lead = config.async_plan_lead_s
        self.plan_lead_prefill = (config.async_plan_lead_prefill_s
                                  if config.async_plan_lead_prefill_s is not None else self.plan_lead)
        self.plan_at_prefill_start = not config.prefill_launch_deadline
        self.plan_lead_line = config.async_plan_lead_line
        if self.plan_lead_line is not None and config.max_stretch_steps != 1:
            raise ValueError("a plan lead by the step's duration needs max_stretch_steps=1")
        self.idle_launch_fn = cost.launch_time if getattr(cost, "hides_launch", False) else None
        self.cap_window = getattr(cost, "power_cap_window_s", None)
        # the delayed onset (sims.profile_cost, "The delayed onset"): in place of the cap's shares, or None
        self.cap_delay_fn = cost.delay_factor if getattr(cost, "cap_delay", None) else None
        # a profile with a sustained trace: the shares are exponential averages with its time
        # constant (sims.profile_cost, "Sustained load"); else the window's plain shares
        self.cap_tau = getattr(cost, "power_cap_tau_s", None)
        # the limiter's fast onset (sims.profile_cost, "The limiter's onset"): a second weighted
        # share at its own time constant, or None
        self.cap_tau_fast = getattr(cost, "power_cap_tau_fast_s", None) if self.cap_tau is not None else None
        # the limiter's slow sag (sims.profile_cost, "The slow sag"): a third weighted share at its
        # time constant, or None
        self.cap_tau_sag = getattr(cost, "power_cap_tau_sag_s", None) if self.cap_tau is not None else None
        # backend -> [weighted average of its ended spans, at time, unweighted average, weighted
        # average at the fast onset's time constant, weighted average at the sag's]
        self.cap_acc: dict[int, list[float]] = {}
        # each prefill span weighs by its step kind's power (sims.profile_cost.cap_weight), where
        # the profile measured the mixed step's sustained run; else 1
        self.cap_weight_fn = cost.cap_weight if getattr(cost, "weights_cap_by_power", False) else None
        # the decode spells' term (sims.profile_cost, "Decode spells"); a cost without the property
        # (an older stand-in) counts them wherever it weighs by power, as before the switch
        self.counts_spells = bool(getattr(cost, "counts_decode_spells", self.cap_weight_fn is not None))
        # the busy level (sims.profile_cost, "The busy level"): a step with prefill launched behind another
        # runs at the profile's no-pause level; None where the model has none
        self.busy_level = getattr(cost, "busy_level", None) if self.cap_window is not None else None
        # the power cap slows every step by its compute share (sims.profile_cost.compute_share),
        # decode-only steps too; without it, steps with prefill alike
        self.cap_share_fn = cost.compute_share if getattr(cost, "caps_by_compute", False) else None
        self.cap_f_ref = getattr(cost, "power_cap_f_ref", None)
        horizon = float(self.arrival[-1]) if n else 0.0
        self.sample_dt = horizon / config.num_samples if horizon > 0 else INF
        self.next_sample = 0.0
        self.series: dict[str, list] = {"t": [], "queue_depth": [], "kv_usage": [], "running": [],
                                        "fragmentation": []}
        self.step_time_fn = cost.step_time
        # decode-only steps charged for their contexts' spread (sims.decode_spread): the step's
        # total context times the attention launch's multiple; None where the cost model has no
        # such term (O(running) a step, so only then)
        self.spread_fn = (cost.decode_context_multiple if getattr(cost, "charges_decode_spread", False)
                          else None)
        # and steps with prefill for their decodes' spread (sims.profile_cost, "Unequal contexts
        # beside a chunk"): their decodes' total context times that launch's multiple
        self.mixed_spread_fn = (cost.mixed_context_multiple if getattr(cost, "charges_mixed_spread", False)
                                else None)
        # the deadline order's step time (scheduler.deadline_order): a constant step's (the echo
        # engine's paced step, which the live engine reads from its flag), else 0 there and the
        # backend's last step is read (`start_step`)
        self.deadline_step_s = float(getattr(cost, "seconds", 0.0))
        # A measured profile charges each packed prefill by itself (sum of p_i^2 attention, not
        # (sum p_i)^2).
        self.charges_chunks = getattr(cost, "accepts_prefill_chunks", False)
        self.span_fn = getattr(cost, "decode_span", None) or partial(decode_span_by_times, cost)
        self.max_fin = config.max_stretch_finishes
        self.progress_every = max(1, n // 50)
        self.next_progress = self.progress_every
        self.now = 0.0
        # placement: the gateway's own policy object; load = prompt + output tokens charged at
        # dispatch (less what the policy expects cached), released when the request finishes
        # (as the gateway does, gateway.backend_pool._deliver)
        self.placement = create_placement(replace(config.placement,
                                                  block_size=sched_config.block_size))
        for be in backends:
            self.placement.add_backend(be.idx)
            self.placement.set_capacity(be.idx, num_blocks * sched_config.block_size)
        self.charged = [0] * n
        # the wait predictor's view (scheduler.admission), kept only while admission or placement
        # by predicted TTFT (scheduler.ttft_placement) reads it: per request, how many requests
        # were unstarted ahead of it where it went, its uncached prompt tokens there and the
        # sequences decoding there at dispatch (what the gateway's handle keeps)
        self.by_ttft = hasattr(self.placement, "predictor")
        predicts = gateway.admits or self.by_ttft
        self.predictor = gateway.predictor if predicts else None
        self.alone = [0] * n if predicts else []
        self.uncached = [0] * n if predicts else []
        self.decoding = [0] * n if predicts else []
        self.predicted = [0.0] * n if predicts else []  # backend_ttft at dispatch (calibration)
        self.qclass = [int(c) for c in gateway._queue_class] if predicts else []
        self.prompt_len = gateway.lists.prompt_len
        self.output_len = gateway.lists.output_len
        if predicts:
            gateway.predictor.inflight = lambda b: backends[b].outstanding
            # the slot model's times (with a read delay, a dispatch's at its Batch's send)
            gateway.predictor.clock = (self.predictor_now if config.gateway_read_delay_s > 0.0
                                       else self.clock.now)
            # each backend's max_num_seqs, as a live backend reports it in its BackendInfo and
            # the gateway hands it to the predictor at registration (scheduler.admission:
            # WaitPredictor.set_slots): the slot model predicts from the first request on
            for be in backends:
                gateway.predictor.set_slots(be.idx, sched_config.max_num_seqs)
            if self.by_ttft:
                self.placement.predictor = gateway.predictor
        self.prefix_of = backends[0].sched.prefix_hashes if (
            config.placement.uses_prefixes and backends and backends[0].sched.prefix_caching) else None
        # agent traces (sims.agent_trace): sessions, pins and what each request found cached
        self.session_of = None
        self.cached_of: list[int] | None = None
        if workload.prompt_ids is not None and backends and backends[0].sched.prefix_caching:
            cached = [0] * n
            for be in backends:
                be.sched.cached_of = cached
                bm = be.sched.bm
                bm.pin_clock = self.clock.now
                bm.pin_budget_blocks = int(config.pin_budget_fraction * bm.num_blocks)
            self.cached_of = cached
            if self.prefix_of is not None:
                self.session_of = partial(_session_info, workload, sched_config.block_size,
                                          backends[0].sched.prompt_tokens)
        self.pulls = None  # sims.kv_pull.PullSim (issue 34)
        if config.kv_pull is not None and self.prefix_of is not None:
            from sims.kv_pull import PullSim, rates_for
            self.pulls = PullSim(self, config.kv_pull,
                                 rates_for(cost, config.kv_pull, sched_config.block_size),
                                 config.num_prefill_backends)
        self.load_samples: list[list[int]] = []
        self.report_s = config.report_interval_s
        self.sample_cursor = 0

    # ---- helpers ---------------------------------------------------------------------------
    def push(self, t: float, kind: int, arg) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, arg))

    def predictor_now(self) -> float:
        """The wait predictor's clock: the loop's, or a dispatch's send time while it is noted."""
        t = self.pred_t
        return self.clock.now() if t is None else t

    def spare(self) -> bool:
        """Idle flush's test, the live gateway's (`BackendPool.has_idle_backend` and its
        busy->idle edge): some backend holds none of the requests placed on it. It once read
        the simulated backend's room and KV use instead, which the gateway cannot see, so the
        simulator flushed windows at once that the live gateway kept open (issue 18)."""
        return self.num_idle > 0

    def dispatch(self, now: float) -> None:
        """Flush one window: the placement policy splits it over backends (one batch each)."""
        batch = self.gateway.take_batch()
        if not batch:
            return
        self.batch_sizes.append(len(batch))
        if self.batch_log is not None:
            self.batch_log.append((now, batch))
        if self.max_fin:
            self.release_stretch_finishes(now)
        dispatch_t, num_tokens, charged = self.dispatch_t, self.num_tokens, self.charged
        prefix_of = self.prefix_of
        session_of = self.session_of
        if len(batch) == 1:  # the common window (idle flush): no split to build
            i = batch[0]
            if session_of is not None:
                s = session_of(i, now)
                if self.by_ttft:
                    b, charged[i] = self.placement.place_one(
                        num_tokens[i], sampled_prefix(s.chain), now, s, self.qclass[i],
                        self.prompt_len[i])
                else:
                    b, charged[i] = self.placement.place_one(
                        num_tokens[i], sampled_prefix(s.chain), now, s)
            elif self.by_ttft:
                b, charged[i] = self.placement.place_one(
                    num_tokens[i], () if prefix_of is None else prefix_of(i), now, None,
                    self.qclass[i], self.prompt_len[i])
            else:
                b, charged[i] = self.placement.place_one(
                    num_tokens[i], () if prefix_of is None else prefix_of(i), now)
            if self.forced_backend is not None:
                b = self.follow_placement(i, b, charged[i])
            dispatch_t[i] = now
            if self.backend_of is not None:
                self.backend_of[i] = b
            if self.predictor is not None:
                self.note_dispatched(b, [i], now)
            be = self.backends[b]
            if not be.outstanding:
                self.num_idle -= 1
            be.outstanding += 1
            be.num_placed += 1
            be.tokens_placed += num_tokens[i]
            self.send(be, batch, now)
            return
        if self.predictor is not None:  # the class and prompt length: what ttft placement reads
            qclass, prompt_len = self.qclass, self.prompt_len
            items = [PlacementItem(num_tokens[i], () if prefix_of is None else prefix_of(i), i,
                                   None, qclass[i], prompt_len[i]) for i in batch]
            if session_of is not None:
                for it in items:
                    it.session = s = session_of(it.payload, now)
                    it.prefix = sampled_prefix(s.chain)
        elif session_of is not None:
            items = []
            for i in batch:
                s = session_of(i, now)
                items.append(PlacementItem(num_tokens[i], sampled_prefix(s.chain), i, s))
        elif prefix_of is None:
            items = [PlacementItem(num_tokens[i], (), i) for i in batch]
        else:
            items = [PlacementItem(num_tokens[i], prefix_of(i), i) for i in batch]
        self.placement.place(items, now)
        if self.forced_backend is not None:
            for it in items:
                it.backend = self.follow_placement(it.payload, it.backend, it.charged)
        parts: dict[int, list[int]] = {}
        for it in items:
            i = it.payload
            dispatch_t[i] = now
            charged[i] = it.charged
            part = parts.get(it.backend)
            if part is None:
                parts[it.backend] = [i]
            else:
                part.append(i)
        backends = self.backends
        for b, part in parts.items():
            if self.backend_of is not None:
                for i in part:
                    self.backend_of[i] = b
            if self.predictor is not None:
                self.note_dispatched(b, part, now)
            be = backends[b]
            if not be.outstanding:
                self.num_idle -= 1
            be.outstanding += len(part)
            be.num_placed += len(part)
            be.tokens_placed += sum(num_tokens[i] for i in part)
            self.send(be, part, now)

    def follow_placement(self, i: int, b: int, charged: int) -> int:
        """Request `i`'s backend as the live gateway placed it (`Workload.forced_backend`),
        its charge moved there from the policy's pick `b` (placed first: the policy's own
        state, its prefix guesses, stays as the live one's would be)."""
        f = self.forced_backend[i]
        if f < 0 or f == b or f >= len(self.backends):
            return b
        loads = self.placement.loads
        if b >= 0:
            loads.add_load(b, -charged)
        loads.add_load(f, charged)
        return f

    def note_dispatched(self, b: int, part: list[int], now: float) -> None:
        """What the gateway's dispatcher records per request it sends (`_send_window`): the
        decode load there before these, each one's place in the queue and uncached tokens.
        With a read delay, at the time its Batch is sent (`send` charges the message next)."""
        if self.read_delay and self.gw_message_s > 0:
            self.pred_t = max(now, self.gw_free) + self.gw_message_s
        try:
            self._note_dispatched(b, part)
        finally:
            self.pred_t = None

    def _note_dispatched(self, b: int, part: list[int]) -> None:
        predictor, qclass = self.predictor, self.qclass
        decoding = predictor.decoding(b)
        charged, out = self.charged, self.output_len
        known = b in predictor.backends
        for i in part:
            u = self.uncached[i] = max(0, charged[i] - out[i])
            if known:
                self.predicted[i] = predictor.backend_ttft(b, qclass[i], u, 0, decoding)
            self.alone[i] = predictor.dispatched(b, qclass[i], i, out[i])
            self.decoding[i] = decoding

    def send(self, be: _Backend, part: list[int], now: float) -> None:
        """One Batch message to `be`: after the gateway's per-message time (its one thread sends
        messages one after another) and the network delay."""
        if self.pulls is not None:  # requests pulling a prefix arrive when it has (issue 34)
            part = self.pulls.divert(be, part, now)
            if not part:
                return
        at = now
        if self.gw_message_s > 0:
            at = self.gw_free = max(now, self.gw_free) + self.gw_message_s
        at += self.delay
        if self.jitter is not None:  # one draw a message, in order (EngineConfig.network_jitter_s)
            at = max(now, at + self.jitter[self.jitter_rng.integers(len(self.jitter))],
                     self.last_delivery[be.idx])
            self.last_delivery[be.idx] = at
        if at > now:
            self.push(at, _DELIVER, (be.idx, part))
        else:
            self.deliver(be, part, now)

    def deliver_later(self, be: _Backend, part: list[int], at: float) -> None:
        """Requests that reach `be` at `at` (after a prefix pull), plus the network delay."""
        self.push(at + self.delay, _DELIVER, (be.idx, part))

    def release_stretch_finishes(self, now: float) -> None:
        """A stretch past finishes ends later than the requests finishing inside it: release
        the tokens of those finished by `now` (as single steps would have), so placement sees
        the load at `now`; `on_stretch` settles the difference at the stretch's end."""
        release = self.placement.release
        for be in self.backends:
            if not be.stretch_past:
                continue
            o, start = 0, be.stretch_start
            for seg in be.stretch_segs:
                if start + seg[4] > now:
                    break
                o += seg[5]
            if o > be.released_early:
                release(be.idx, o - be.released_early)
                be.released_early = o

    def deliver(self, be: _Backend, batch: list[int], now: float) -> None:
        be.message_s += self.be_message_s
        be.inbox.extend(batch)
        be.inbox_t.extend([now] * len(batch))
        if not be.busy:
            self.start_step(be, now, after_step=False)
        elif be.stretch_segs is not None:
            self.truncate(be, now)

    def truncate(self, be: _Backend, now: float) -> None:
        """End the stretch after the step in progress at `now` (a step ending at `now` is done)."""
        span_fn = self.span_fn
        segs = be.stretch_segs
        e = now - be.stretch_start
        t0 = 0.0
        for idx, seg in enumerate(segs):
            if e < seg[4]:
                break
            t0 = seg[4]
        else:
            return  # the last step ends at `now`: nothing in progress
        ks, n, ctx, nfin, t1, tokens = seg
        # c = steps of this segment done by `now`: the largest c < ks with span(c) <= e - t0;
        # steps only lengthen, so e / (first step) is an upper bound and close
        e -= t0
        first = span_fn(n, ctx, 1)
        c = min(ks - 1, int(e / first)) if first > 0 else ks - 1
        while c > 0 and span_fn(n, ctx, c) > e:
            c -= 1
        while c + 1 < ks and span_fn(n, ctx, c + 1) <= e:
            c += 1
        j = c + 1  # with the one in progress
        if j == ks and idx == len(segs) - 1:
            return
        end = t1 if j == ks else t0 + span_fn(n, ctx, j)
        be.stretch_segs = segs[:idx] + [(j, n, ctx, nfin, end, tokens) if j == ks
                                        else (j, n, ctx, 0, end, 0)]
        be.end_time = be.stretch_start + end
        be.version += 1
        self.push(be.end_time, _STRETCH, (be.idx, be.version))

    def admit(self, be: _Backend, now: float, cutoff: float = INF) -> None:
        """Admit the inbox's requests delivered by `cutoff` (the step's plan time); the rest
        stay for the next step."""
        sched = be.sched
        refused = 0
        inbox, inbox_t = be.inbox, be.inbox_t
        late = len(inbox)
        if cutoff < inbox_t[-1]:
            late = next(j for j, t in enumerate(inbox_t) if t > cutoff)
        add = sched.add
        for i in inbox if late == len(inbox) else inbox[:late]:
            if not add(i, now):
                self.rejected[i] = True
                if self.predictor is not None:
                    self.predictor.gone(be.idx, self.qclass[i], i)
                self.placement.release(be.idx, self.charged[i])
                refused += 1
        del inbox[:late], inbox_t[:late]
        if refused:
            self.settle(be, refused)

    def prefill_share(self, be: _Backend, now: float) -> float:
        """Share of the power-cap window before `now` that ran steps with prefill tokens (each
        weighted by its kind's power, `cap_weight_fn`, where the profile has it); with a time
        constant tau (`cap_tau`), their exponential average: each instant weighted by
        exp(-age / tau) / tau (the ended spans folded into one running value)."""
        return self._prefill_shares(be, now)[0]

    def _prefill_shares(self, be: _Backend, now: float) -> tuple[float, float, float | None, float | None]:
        """(weighted, unweighted, weighted at the fast onset's time constant or None, weighted at
        the slow sag's or None) prefill shares (`prefill_share`)."""
        spans = be.prefill_spans
        tau, tf, ts = self.cap_tau, self.cap_tau_fast, self.cap_tau_sag
        if tau is not None:
            acc = self.cap_acc.setdefault(be.idx, [0.0, 0.0, 0.0, 0.0, 0.0])
            while spans and spans[0][1] <= now:  # spans of one backend follow each other
                a, b, w = spans.pop(0)
                decay, span = math.exp((acc[1] - b) / tau), -math.expm1((a - b) / tau)
                acc[0] = acc[0] * decay + w * span
                acc[2] = acc[2] * decay + span
                if tf is not None:
                    acc[3] = acc[3] * math.exp((acc[1] - b) / tf) - w * math.expm1((a - b) / tf)
                if ts is not None:
                    acc[4] = acc[4] * math.exp((acc[1] - b) / ts) - w * math.expm1((a - b) / ts)
                acc[1] = b
            ow = ou = of = os_ = 0.0  # the spans still open (summed apart, as before the weights)
            for a, b, w in spans:
                if a < now:
                    span = math.exp((min(b, now) - now) / tau) - math.exp((a - now) / tau)
                    ow += w * span
                    ou += span
                    if tf is not None:
                        of += w * (math.exp((min(b, now) - now) / tf) - math.exp((a - now) / tf))
                    if ts is not None:
                        os_ += w * (math.exp((min(b, now) - now) / ts) - math.exp((a - now) / ts))
            decay = math.exp((acc[1] - now) / tau)
            fast = None if tf is None else acc[3] * math.exp((acc[1] - now) / tf) + of
            sag = None if ts is None else acc[4] * math.exp((acc[1] - now) / ts) + os_
            return acc[0] * decay + ow, acc[2] * decay + ou, fast, sag
        t0 = now - self.cap_window
        while spans and spans[0][1] <= t0:
            spans.pop(0)
        fw = fu = 0.0
        for a, b, w in spans:
            if b > t0:
                span = min(b, now) - max(a, t0)
                fw += w * span
                fu += span
        return fw / self.cap_window, fu / self.cap_window, None, None

    def cap_shares(self, be: _Backend, now: float) -> tuple[float, float, float | None, float | None]:
        """(f, g, f_fast, f_sag): the power-cap window's shares before `now` that ran steps with
        prefill (f weighted as `prefill_share`) and decode-only steps (the rest of the time busy
        since the last idle spell), and f at the fast onset's and at the slow sag's time constants
        (None without them)."""
        f, fu, ff, fs = self._prefill_shares(be, now)
        if self.cap_tau is not None:
            g = -math.expm1((be.busy_since - now) / self.cap_tau) - fu
            return f, max(0.0, g), ff, fs
        g = (now - max(now - self.cap_window, be.busy_since)) / self.cap_window - fu
        return f, max(0.0, g), ff, fs

    def spread_multiple(self, be: _Backend, sched) -> float:
        """The decode batch's spread multiple (`spread_fn`) of `be`'s decoding sequences."""
        return self._kept_multiple(be, sched, 0, self.spread_fn)

    def mixed_multiple(self, be: _Backend, sched) -> float:
        """The multiple a step with prefill charges its decodes' context for their spread
        (`mixed_spread_fn`)."""
        return self._kept_multiple(be, sched, 1, self.mixed_spread_fn)

    @staticmethod
    def _kept_multiple(be: _Backend, sched, slot: int, fn) -> float:
        """`fn` of `be`'s decoding contexts, kept in `be.multiples[slot]` for 8 steps while their
        count stays: listing the contexts is O(running) and a launch of several waves costs
        ~1 ms to model, where a context grows a token a step and the multiple drifts slowly (a
        join or a finish changes the count: recomputed at once)."""
        dec = sched.sched.decodes
        key = (dec.num_decoding, dec.step >> 3)
        kept = be.multiples[slot]
        if kept[0] != key:
            kept[0] = key
            kept[1] = fn([c for c, _ in sched.decode_contexts()])
        return kept[1]

    def plan_cutoff(self, be: _Backend, now: float, after_step: bool) -> float:
        """When the engine planned the step starting at `now` (see `async_plan_lead_s`)."""
        lead = self.plan_lead
        if lead is None or not after_step:
            return now
        if be.plan_prefill and self.plan_at_prefill_start:
            return be.step_start
        if self.plan_lead_line is not None:  # a line in the ending step's duration
            a, b, lo, hi = self.plan_lead_line[1 if be.plan_prefill else 0]
            return now - min(max(lo, min(hi, a + b * (now - be.step_start))), now - be.step_start)
        if be.plan_prefill:  # the step that ends now carried prefill
            return now - self.plan_lead_prefill
        return now - lead

    def start_step(self, be: _Backend, now: float, after_step: bool = True) -> None:
        if not after_step:
            be.busy_since = now
        if be.inbox:
            self.admit(be, now, self.plan_cutoff(be, now, after_step))
        sched = be.sched
        if not sched.sched.requests:  # nothing running or waiting: no step (as the engine)
            if be.inbox:  # delivered after the plan that found nothing: it starts at once
                self.admit(be, now)
            if not sched.sched.requests:
                be.busy = False
                return
        max_k = self.max_k
        # a stretch is not truncated for requests already in the inbox: one step, then admit
        # (with the power cap on every step, a stretch only once its window holds no more prefill
        # time than the profile's paused points had: the slowdown's prefill part is then 0)
        if max_k > 1 and not sched.sched.waiting and not be.inbox and (  # num_waiting == 0
                self.cap_share_fn is None or self.prefill_share(be, now) <= self.cap_f_ref):
            # past finishes only while they cannot change what spare() reads (module doc)
            past = (self.max_fin if self.max_fin and sched.has_room
                    and sched.kv_usage < self.watermark else 0)
            k, segs = sched.decode_stretch(max_k, past)
            if k > 1:
                span_fn = self.span_fn
                # host tier copies queued since the last step
                t = sched.take_copy_seconds() if sched.host is not None else 0.0
                t += be.message_s
                be.message_s = 0.0
                out = []
                cap_fg = self.cap_shares(be, now) if self.cap_share_fn is not None else None
                spread = None
                a = 0
                for ks, n_dec, ctx, nfin, tokens in segs:
                    if self.spread_fn is not None:  # at the segment's first step, its contexts
                        if not a:
                            ctx = int(ctx * self.spread_multiple(be, sched))
                        else:
                            if spread is None:
                                spread = sched.decode_contexts()
                            ctx = int(ctx * self.spread_fn([c + a for c, left in spread if left > a]))
                        a += ks
                    span = span_fn(n_dec, ctx, ks)
                    if cap_fg is not None:  # the decode-busy part, as at the stretch's start
                        span *= self.cost.prefill_slowdown(cap_fg[0], cap_fg[1], self.cap_share_fn(n_dec, 0, ctx),
                                                           cap_fg[2], cap_fg[3])
                    t += span
                    out.append((ks, n_dec, ctx, nfin, t, tokens))
                be.stretch_segs, be.stretch_past = out, past > 0
                be.prefill_run_start = None  # decode-only steps end a run of steps with prefill
                be.stretch_start = be.step_start = now
                be.plan_prefill = False
                be.busy = True
                be.end_time = now + t
                be.version += 1
                self.seq = seq = self.seq + 1  # push(), inlined: once per event
                heappush(self.heap, (be.end_time, seq, _STRETCH, (be.idx, be.version)))
                return
        plan = sched.schedule(now, self.deadline_step_s or max(0.0, be.end_time - be.step_start))
        if plan is None:
            be.busy = False
            return
        num_decode, num_prefill, num_ctx = plan
        if self.spread_fn is not None and not num_prefill:
            num_ctx = int(num_ctx * self.spread_multiple(be, sched))
        elif self.mixed_spread_fn is not None and num_prefill and num_decode:  # (one decode: 1.0 but its tiles)
            dec = sched.sched.decodes  # the decodes' part of num_ctx (SchedulerAdapter.schedule)
            num_ctx += int((dec.offset_sum + dec.num_decoding * dec.step + num_decode)
                           * (self.mixed_multiple(be, sched) - 1.0))
        if self.charges_chunks and num_prefill:
            dt = self.step_time_fn(num_decode, num_prefill, num_ctx, sched.prefill_chunks)
        else:
            dt = self.step_time_fn(num_decode, num_prefill, num_ctx)
        if sched.host is not None:
            dt += sched.take_copy_seconds()
        if be.message_s:
            dt += be.message_s
            be.message_s = 0.0
        if self.cap_delay_fn is not None:
            if num_prefill:
                if be.prefill_run_start is None or not after_step:
                    be.prefill_run_start = now
                dt *= self.cap_delay_fn(num_decode, num_prefill, num_ctx,
                                        sched.prefill_chunks if self.charges_chunks else None,
                                        now - be.prefill_run_start, dt, after_step)
            else:
                be.prefill_run_start = None
        if self.cap_window is not None and (num_prefill or self.cap_share_fn is not None):
            f, g, ff, fs = self.cap_shares(be, now)
            w = 1.0
            if num_prefill and self.cap_weight_fn is not None:
                w = self.cap_weight_fn(num_decode, num_prefill, num_ctx,
                                       sched.prefill_chunks if self.charges_chunks else None)
                # the busy engine's decode spells left the power budget spent: a step with prefill
                # throttles as if they had been its own kind (sims.profile_cost, "Decode spells")
                if self.counts_spells:
                    f += w * g
            if self.cap_share_fn is None:
                dt *= self.cost.prefill_slowdown(f, g, None, ff, fs)
            else:
                share = self.cap_share_fn(num_decode, num_prefill, num_ctx,
                                          sched.prefill_chunks if self.charges_chunks and num_prefill
                                          else None)
                dt *= self.cost.prefill_slowdown(f, g, share, ff, fs)
            if num_prefill and self.busy_level is not None and after_step:
                dt *= self.busy_level
            if num_prefill:
                be.prefill_spans.append((now, now + dt, w))
        if self.idle_launch_fn is not None and not after_step:
            # the async loop hides a step's launch behind the step before it; after an idle
            # spell nothing runs before it (a cost model that hides launches charges it here)
            dt += self.idle_launch_fn(num_decode, num_prefill)
        self.step_rows.append((num_decode, num_prefill, dt))
        if self.per_stream or self.gl_on:
            be.streams = num_decode + len(sched.prefill_chunks)
        if self.step_log is not None:
            self.step_log.append((now, be.idx, num_decode,
                                  [(int(c.request_id), len(c.token_ids), c.start_pos)
                                   for c in sched.prefill_chunks],
                                  [int(r) for r in sched.preempted]))
        be.busy = True
        be.plan = plan
        be.plan_prefill = num_prefill > 0
        be.step_start = now
        be.end_time = now + dt
        self.seq = seq = self.seq + 1  # push(), inlined: once per event
        heappush(self.heap, (be.end_time, seq, _STEP, be.idx))

    def finish_requests(self, be: _Backend, done: list[int], now: float, streams: int = 0) -> None:
        """`done` finished in a step (of `streams` sequences) that ended at `now`."""
        if not done:
            return
        finish_t = self.finish_t
        for i in done:
            finish_t[i] = now
        if self.finish_streams is not None:
            fs = self.finish_streams
            for i in done:
                fs[i] = streams
        if self.read_delay:  # the gateway hears of them later (`on_read`)
            self.push(max(now, self.clock.now()) + self.read_delay, _READ, (be.idx, (), done))
            return
        self.gateway_finished(be, done, now)

    def gateway_finished(self, be: _Backend, done: list[int], now: float) -> None:
        """What the gateway does as it reads the last tokens of `done` (at `now`): the
        predictor's slots, placement's load, the count in flight."""
        charged = self.charged
        if self.request_log is not None:
            self.request_log.extend((now, be.idx, i, 1) for i in done)
        tokens = 0
        for i in done:
            tokens += charged[i]
        if self.predictor is not None:  # the slot model: a slot free, the step time measured
            finished, out = self.predictor.finished, self.output_len
            for i in done:
                finished(be.idx, i, now, out[i])
        self.placement.release(be.idx, tokens)  # one release for all: placement reads the sum
        self.settle(be, len(done))

    def settle(self, be: _Backend, num: int) -> None:
        """`num` of the backend's requests left it (finished or refused)."""
        be.outstanding -= num
        if not be.outstanding:
            self.num_idle += 1

    def after_step(self, be: _Backend, now: float) -> None:
        be.busy_s += now - be.step_start
        if self.prefix_of is not None and now - be.last_report >= self.report_s:
            be.last_report = now  # a LoadReport: what the prefix cache holds now
            self.placement.report(be.idx, be.sched.prefix_report(), now)
        self.start_step(be, now)
        gateway = self.gateway
        if gateway.num_pending and gateway.idle_flush and (
                not self.gl_on or self.num_idle or self.gl_finished):
            # the backend's new load may allow an idle flush (with the gateway loop modelled:
            # only as the live gateway polls, at an idle backend or a finish, `on_capacity`)
            self.set_timer(now)
        self.gl_finished = False

    def handle(self, dec, now: float) -> None:
        """Act on a batcher decision: flush while due, then arm the one timer."""
        gateway = self.gateway
        while dec.flush_now:
            self.dispatch(now)
            if not gateway.num_pending:
                # nothing left: poll() would answer IDLE and leave the batcher as it stands
                # (the spare report it would pass on is made again by the next push or poll)
                self.timer_deadline = INF
                return
            dec = gateway.poll(self.num_idle > 0)  # spare(), inlined
        deadline = dec.deadline
        if deadline is None:
            self.timer_deadline = INF
        elif deadline != self.timer_deadline:
            self.timer_deadline = deadline
            self.seq = seq = self.seq + 1  # push(), inlined: once per window
            heappush(self.heap, (deadline + self.gl_late, seq, _TIMER, deadline))

    def set_timer(self, now: float) -> None:
        self.handle(self.gateway.poll(self.spare()), now)

    # ---- one handler per event kind ---------------------------------------------------------
    # A handler returns True for a stale event: it counts, but takes no time-series sample.
    def on_step(self, arg: int, now: float) -> None:
        be = self.backends[arg]
        plan, be.plan = be.plan, None
        firsts, done = be.sched.complete_step(plan)
        first_t = self.first_t
        if self.read_delay:  # the gateway reads the step's outputs later (`on_read`)
            new = [r for r in firsts if first_t[r] != first_t[r]]
            for r in new:
                first_t[r] = now
            for i in done:
                self.finish_t[i] = now
            if self.per_stream:
                fs, ds = self.first_streams, self.finish_streams
                for r in new:
                    fs[r] = be.streams
                for i in done:
                    ds[i] = be.streams
            if new or done:
                self.push(now + self.read_delay, _READ, (arg, new, done))
            self.after_step(be, now)
            return
        new = [] if self.gl_on else None
        for r in firsts:
            if first_t[r] != first_t[r]:  # NaN: not a re-prefill after preemption
                first_t[r] = now
                if self.per_stream:
                    self.first_streams[r] = be.streams
                if new is not None:
                    new.append(r)
                self.gateway_started(arg, r, now)
        if new is not None:  # the step's outputs on the gateway loop (EngineConfig.gateway_loop_*)
            self.push(now + self.gl_read, _GWJOB, (self.gl_stream * be.streams, new))
            self.gl_finished = bool(done)
        self.finish_requests(be, done, now, be.streams)
        self.after_step(be, now)

    def gateway_started(self, b: int, r: int, now: float) -> None:
        """The gateway reads request `r`'s first token from backend `b` at `now`."""
        if self.request_log is not None:
            self.request_log.append((now, b, r, 0))
        if self.predictor is not None:
            self.predictor.started(b, self.qclass[r], now, now - self.dispatch_t[r],
                                   self.alone[r], self.uncached[r], self.decoding[r],
                                   self.predicted[r], r)

    def on_read(self, arg: tuple, now: float) -> bool | None:
        """The gateway reads a step's outputs (`gateway_read_delay_s`): its first tokens, then
        its finishes; after the window being sent, if any (one thread)."""
        if now < self.gw_free:
            self.push(self.gw_free, _READ, arg)
            return True
        b, firsts, done = arg
        for r in firsts:
            self.gateway_started(b, r, now)
        if done:
            self.gateway_finished(self.backends[b], done, now)
            gateway = self.gateway
            if gateway.num_pending and gateway.idle_flush and self.num_idle:
                self.set_timer(now)  # its last request done: an idle flush may be due
        return None

    def on_stretch(self, arg: tuple[int, int], now: float) -> bool | None:
        b, version = arg
        be = self.backends[b]
        if version != be.version:
            return True  # stale: superseded by a truncation
        segs, past = be.stretch_segs, be.stretch_past
        be.stretch_segs, be.stretch_past = None, False
        done = be.sched.advance(segs[0][0] if len(segs) == 1 else sum(sg[0] for sg in segs), past)
        if len(segs) == 1:
            self.stretch_rows.append(segs[0][:3])
            self.finish_requests(be, done, now, segs[0][1])
        else:  # finishes in step order: each segment's at its end
            start, d = be.stretch_start, 0
            for ks, n_dec, ctx, nfin, t, _ in segs:
                self.stretch_rows.append((ks, n_dec, ctx))
                if nfin:
                    self.finish_requests(be, done[d:d + nfin], start + t, n_dec)
                    d += nfin
            self.finish_requests(be, done[d:], now, segs[-1][1])
        if be.released_early:
            self.placement.release(be.idx, -be.released_early)  # released twice: take one back
            be.released_early = 0
        self.after_step(be, now)

    def on_timer(self, arg: float, now: float) -> bool | None:
        if arg != self.timer_deadline:
            return True  # stale: superseded by a later deadline
        if self.gl_on:
            if self.gl_timer_held != arg and self.gl_free > now:
                # due while the loop runs its ready callbacks (a step's token writes): after them
                self.gl_timer_held = arg
                self.push(self.gl_free, _TIMER, arg)
                return True
            self.gl_timer_held = None
        self.timer_deadline = INF
        self.set_timer(now)

    def gl_job(self, t: float, size: float) -> float:
        """A job of `size` seconds reaching the gateway loop at `t` (jobs reach it in time
        order): when the loop starts it. Keeps the integral of the loop's residual work over the
        arrivals' span (the "recorded" arrivals' wait)."""
        free, last = self.gl_free, self.gl_period[0]
        if self.gl_t0 is None:
            self.gl_t0, self.gl_t1 = (self.arrival[0], self.arrival[-1]) if self.n else (t, t)
        lo, hi = max(last, self.gl_t0), min(t, free, self.gl_t1)
        if hi > lo:  # the residual falls linearly from free - lo to free - hi
            self.gl_area += (hi - lo) * ((free - lo) + (free - hi)) / 2
        start = max(t, free)
        self.gl_free = start + size
        self.gl_period = (t, self.gl_free)
        return start

    def gl_residual_mean(self) -> float:
        """The loop's residual work averaged over the arrivals' span: what a request reaching
        the gateway at a random time waits for it."""
        if self.gl_t0 is None or self.gl_t1 <= self.gl_t0:
            return 0.0
        free, lo = self.gl_free, max(self.gl_period[0], self.gl_t0)
        hi = min(free, self.gl_t1)
        area = self.gl_area + ((hi - lo) * ((free - lo) + (free - hi)) / 2 if hi > lo else 0.0)
        return area / (self.gl_t1 - self.gl_t0)

    def on_gwjob(self, arg: tuple[float, list[int]], now: float) -> None:
        """A step's outputs reach the gateway loop: their fan-out and token writes."""
        size, firsts = arg
        wait = self.gl_job(now, size) - now
        if wait > 0.0:
            fw = self.gl_first_wait
            for r in firsts:
                fw[r] = wait

    def on_gwarr(self, i: int, now: float) -> None:
        """An arrival held while the loop was busy is pushed (gateway_loop_arrivals "wait")."""
        self.on_arrival(i, now)
        self.gl_pushed.discard(i)

    def on_deliver(self, arg: tuple[int, list[int]], now: float) -> None:
        b, batch = arg
        self.deliver(self.backends[b], batch, now)

    def on_arrival(self, i: int, now: float) -> None:
        if self.gl_on and i not in self.gl_pushed:
            # its parse on the loop, behind what the loop is doing ("recorded": `now` is the push)
            end = self.gl_job(now, self.gl_request) + self.gl_request
            if end > now and not self.gl_recorded:
                self.gl_pushed.add(i)
                self.push(end, _GWARR, i)
                return
        dec = self.gateway.push(i, now, self.num_idle > 0)  # spare(), inlined
        if dec.rejected is not None:
            self.rejected[i] = True
        self.handle(dec, now)

    def sample(self, now: float) -> None:
        backends, series = self.backends, self.series
        k = self.config.max_backends_per_sample
        if len(backends) > k:
            start = self.sample_cursor
            self.sample_cursor = (start + k) % len(backends)
            backends = [backends[(start + j) % len(backends)] for j in range(k)]
        scale = len(self.backends) / len(backends)
        # one pass, the scheduler's own fields (the adapter's properties cost a call each);
        # the sums stay sum()s over the same values in the same order
        waiting, kv_usage, running, fragmentation = [], [], [], []
        for b in backends:
            adapter = b.sched
            sched = adapter.sched
            waiting.append(len(b.inbox) + len(sched.waiting))
            kv_usage.append(adapter.bm.usage)
            running.append(len(sched.running))
            fragmentation.append(sched.internal_fragmentation())
        series["t"].append(now)
        series["queue_depth"].append(self.gateway.num_pending + scale * sum(waiting))
        series["kv_usage"].append(sum(kv_usage) / len(backends))
        series["running"].append(scale * sum(running))
        series["fragmentation"].append(sum(fragmentation) / len(backends))
        if self.cached_of is not None:  # agent traces: each backend's outstanding tokens
            load = self.placement.loads.load
            self.load_samples.append([load[b.idx] for b in self.backends])

    # ---- the loop --------------------------------------------------------------------------------
    def run(self) -> SimResult:
        # The loop makes no reference cycles (a 100k-request run leaves none for gc.collect()),
        # while each automatic collection walks every live object: the backends' pools and
        # sequences, and the per-step records. Paused for the loop, as it changes nothing.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.loop()
            return self.result()
        finally:
            if gc_was_enabled:
                gc.enable()

    def loop(self) -> None:
        """Handle events in time order until none is left."""
        handlers = (self.on_step, self.on_stretch, self.on_timer, self.on_deliver,  # by kind
                    self.on_read, self.on_gwjob, self.on_gwarr)
        arrival, heap, clock, n = self.arrival, self.heap, self.clock, self.n
        on_arrival, heappop = self.on_arrival, heapq.heappop
        progress = self.config.progress
        sample_dt, next_sample = self.sample_dt, self.next_sample
        events = 0
        i = 0
        now = 0.0
        while True:
            t_arr = arrival[i] if i < n else INF
            if heap and heap[0][0] <= t_arr:
                now, _, kind, arg = heappop(heap)
                clock.set(now)
                events += 1
                if handlers[kind](arg, now):
                    continue
            elif i < n:
                now = t_arr
                clock.set(now)
                events += 1
                on_arrival(i, now)
                i += 1
                if progress and i >= self.next_progress:
                    self.next_progress += self.progress_every
                    _progress(i, n, self.wall0)
            else:
                break
            if now >= next_sample:
                next_sample = now + sample_dt
                self.sample(now)
        if progress:
            _progress(n, n, self.wall0, end="\n")
        self.events, self.now = events, now

    def client_times(self, times: list[float], streams: list[int] | None) -> np.ndarray:
        """When the client sees the tokens of steps that ended at `times`: + the delivery path
        (delivery_delay_s, + delivery_per_stream_s per stream of each token's step)."""
        t = np.array(times, dtype=np.float64) + self.config.delivery_delay_s
        if streams is not None:
            t += self.per_stream * np.array(streams, dtype=np.float64)
        return t

    def result(self) -> SimResult:
        """Expand per-step records (single steps and stretches) and build the outcome."""
        step_decode, step_prefill, step_time = expand_steps(self.cost, self.step_rows,
                                                            self.stretch_rows)
        # ITL: every sequence decoding in a step waited that step's duration for its token.
        itl_values, itl_weights = step_time, step_decode.astype(np.float64)
        backends = self.backends
        gl_in, gl_first = 0.0, 0.0
        if self.gl_on:  # the gateway loop's waits (EngineConfig.gateway_loop_*)
            residual = self.gl_residual_mean()
            gl_in = residual if self.gl_recorded else 0.0
            gl_first = np.array(self.gl_first_wait, dtype=np.float64) + gl_in
            self.extra_gl = {"residual_mean_s": residual, "arrivals": self.config.gateway_loop_arrivals,
                             "first_wait_mean_s": float(np.mean(self.gl_first_wait)) if self.n else 0.0}
        return SimResult(
            workload=self.workload, dispatch_time=np.array(self.dispatch_t, dtype=np.float64),
            first_token_time=self.client_times(self.first_t, self.first_streams) + gl_first,
            finish_time=self.client_times(self.finish_t, self.finish_streams) + gl_in,
            num_output=self.workload.output_len.copy(), queue_class=self.gateway.classes(),
            rejected=self.rejected, itl_values=itl_values, itl_weights=itl_weights,
            batch_sizes=np.array(self.batch_sizes, dtype=np.int64),
            step_decode=step_decode, step_prefill=step_prefill, step_time=step_time,
            series={k: np.array(v) for k, v in self.series.items()},
            backend_stats=[b.sched.stats() for b in backends], events=self.events,
            wall_s=time.perf_counter() - self.wall0, sim_end=self.now,
            extra={"num_kv_blocks": self.num_blocks, "placement": self.placement_stats(),
                   **({"kv_pull": self.pulls.stats()} if self.pulls is not None else {}),
                   **({"cached_tokens": self.cached_of, "backend_load_samples": self.load_samples,
                       "pins": [b.sched.bm.pin_status() | {"refused_at_admission":
                                                          b.sched.num_pins_refused}
                                for b in backends]}
                      if self.cached_of is not None else {}),
                   "retry_after_s": dict(self.gateway.retry_after),
                   "admission_predictions": dict(self.gateway.predictions),
                   **({"batches": self.batch_log, "backend_of": self.backend_of,
                       "request_log": self.request_log} if self.batch_log is not None else {}),
                   **({"steps": self.step_log} if self.step_log is not None else {}),
                   **({"gateway_loop": self.extra_gl} if self.gl_on else {})})

    def placement_stats(self) -> dict:
        p = self.placement
        out = {"policy": p.name,
               "backend_busy_s": [be.busy_s for be in self.backends],
               "backend_requests": [be.num_placed for be in self.backends],
               "backend_tokens": [be.tokens_placed for be in self.backends]}
        for k in ("num_affinity", "num_spilled", "num_cold", "num_home", "num_predicted",
                  "num_near_ties"):
            if hasattr(p, k):
                out[k] = getattr(p, k)
        if self.session_of is not None and hasattr(p, "sessions"):
            out["sessions"] = p.sessions.stats()
        return out


def expand_steps(cost: CostModel, step_rows: list[tuple], stretch_rows: list[tuple]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(decode sequences, prefill tokens, duration) of every step: the single steps' rows, then
    every stretch segment's steps. Written into arrays made once, with in-place arithmetic: a
    100,000-request, 512-backend run expands 12.8M steps, and each temporary array of that
    length costs a pass and ~100 MB of fresh pages."""
    m = len(step_rows)
    rows = np.array(stretch_rows, dtype=np.int64).reshape(-1, 3)
    ks, nd = rows[:, 0], rows[:, 1]
    total = m + int(ks.sum())
    step_decode = np.empty(total, dtype=np.int64)
    step_prefill = np.zeros(total, dtype=np.int64)
    step_time = np.empty(total, dtype=np.float64)
    if m:
        single = np.array(step_rows, dtype=np.float64).reshape(-1, 3)
        step_decode[:m] = single[:, 0]
        step_prefill[:m] = single[:, 1]
        step_time[:m] = single[:, 2]
    if total == m:
        return step_decode, step_prefill, step_time
    step_decode[m:] = np.repeat(nd, ks)
    # Segments repeat (one request alone on each of many backends: one kind of segment): when
    # the distinct (steps, batch, first context) are few, each is computed once and the run's
    # steps are gathered from them — the same values (the same formula on the same inputs)
    # for a gather instead of a dozen arithmetic passes over every step
    kinds, kind_of = _segment_kinds(rows)
    if kinds is not None and 4 * len(kinds) <= len(rows):
        kind_times = _segment_step_times(cost, kinds)
        kind_first = np.cumsum(kinds[:, 0]) - kinds[:, 0]  # a kind's first step in kind_times
        first = np.cumsum(ks) - ks                          # a segment's first stretch step
        src = np.arange(total - m, dtype=np.int64)
        src += np.repeat(kind_first[kind_of] - first, ks)
        np.take(kind_times, src, out=step_time[m:])
        return step_decode, step_prefill, step_time
    step_time[m:] = _segment_step_times(cost, rows)
    return step_decode, step_prefill, step_time


def _segment_kinds(rows: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The distinct rows and each row's index among them (np.unique's), through one int64 key
    per row (a 1-D sort: np.unique over rows costs ~20x more); (None, None) when the values are
    too large to pack."""
    hi = rows.max(axis=0) + 1
    if rows.min() < 0 or float(hi[0]) * float(hi[1]) * float(hi[2]) >= 2.0**62:
        return None, None
    key = (rows[:, 0] * hi[1] + rows[:, 1]) * hi[2] + rows[:, 2]
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return rows[first], inv


def _segment_step_times(cost: CostModel, rows: np.ndarray) -> np.ndarray:
    """The duration of every step of stretch segments ``(steps, batch, first context)``, in
    order: a segment's context grows by its batch each step."""
    ks, nd = rows[:, 0], rows[:, 1]
    n_step = np.repeat(nd, ks)
    # context of step i of a segment: its first context + i * batch, with i = (index among the
    # stretch steps) - (the segment's first index): one repeat of (first context - first index *
    # batch) plus arange * batch
    first = np.cumsum(ks) - ks
    ctx_step = np.arange(len(n_step), dtype=np.int64)
    ctx_step *= n_step
    ctx_step += np.repeat(rows[:, 2] - first * nd, ks)
    step_times_fn = getattr(cost, "decode_step_times", None)
    if step_times_fn is not None:
        return step_times_fn(n_step, ctx_step)
    return np.concatenate([cost.decode_times(int(n), int(c), int(k)) for k, n, c in rows])


def _progress(done: int, total: int, wall0: float, end: str = "") -> None:
    import sys
    width = 30
    frac = done / total if total else 1.0
    bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
    sys.stderr.write(f"\r[{bar}] {done}/{total} requests  {time.perf_counter() - wall0:.1f}s{end}")
    sys.stderr.flush()
