"""The one seam between the simulator and `scheduler/`: thin adapters over the real objects.

`GatewayAdapter` drives the real `ClassQueues` + `DynamicWindowBatcher` on the simulator's
`ManualClock`; `BackendAdapter` drives the real `StepScheduler` (and its `BlockManager`) and plays the
runner: it turns a `StepPlan` into the three numbers a cost model needs, and hands back a synthetic
`StepResult` (token 0 for every sampling chunk; no stop tokens, so requests end by length, as with
`ignore_eos`). No policy lives here: admission, batching, ordering, preemption and KV allocation are
all the scheduler's.

Request i of the workload is request id ``str(i)``. With prefix caching on, its prompt token ids
are distinct per request (``i·2^20 + position``), except that a request in prefix group g starts
with that group's prefix (negative ids), so the block manager's prefix cache sees real sharing.
With prefix caching off only the counts matter (the block manager allocates by count), so the
prompt is ``[0] * n``: no per-request token objects.

Prefix caching in the simulator (`SimSchedulerConfig.enable_prefix_caching`): True / False, or
None = auto: on exactly when the workload has shared prefixes. Without shared prefixes the cache
can only hit a preempted sequence's own blocks on its recompute (the simulator's generated tokens
are dummies, so nothing else ever matches), and it costs ~40 hashed block registrations and ~40
evictions per request: auto turns it off there. Under preemption that makes a recompute cost its
whole prefill where the live engine (caching on) may reuse blocks still cached: set True to model
that (`tidegate sim validate` does, as it compares against the live engine). Auto is the default
of the dataclass, `sim run`, `sweep`, `search` and `python -m sims`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from scheduler.admission import AdmissionConfig, AdmissionControl, Refusal
from scheduler.batcher import BatcherConfig, Decision, DynamicWindowBatcher
from scheduler.capacity import DEFAULT_CAPACITY
from scheduler.classes import QueueClass
from scheduler.clock import ManualClock
from scheduler.deadline_order import DEFAULT_MARGIN_S
from scheduler.host_tier import SwapCostModel
from scheduler.prefix_index import DEPTHS, PrefixSummary, prefix_hashes
from scheduler.queues import ClassQueues, PendingRequest, QueueConfig
from scheduler.slo import SLOTargets
from scheduler.step_scheduler import PrefillCap, SchedulerConfig, StepResult, StepScheduler
from sims.workload import Workload

_TOKEN_STRIDE = 1 << 20
_NO_STOPS: frozenset[str] = frozenset()  # no simulated request samples a stop token


class WorkloadLists:
    """A workload's per-request columns as Python lists, built once and shared by the adapters:
    an int read from a list costs ~10 ns, a numpy scalar read and int() ~90 ns."""

    def __init__(self, workload: Workload):
        self.queue_class = workload.queue_class.tolist()
        self.prompt_len = workload.prompt_len.tolist()
        self.output_len = workload.output_len.tolist()
        self.priority = workload.priority.tolist()


@dataclass(frozen=True)
class SimSchedulerConfig:
    """The scheduler-side settings of a simulated deployment (per backend where it applies)."""
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    max_num_seqs: int = DEFAULT_CAPACITY.max_num_seqs
    max_num_batched_tokens: int = DEFAULT_CAPACITY.max_num_batched_tokens
    block_size: int = DEFAULT_CAPACITY.block_size
    max_model_len: int = 16384
    # True | False | None = auto: on exactly when the workload has shared prefixes (module doc)
    enable_prefix_caching: bool | None = None
    # host-memory KV tier (scheduler.host_tier): GiB of host memory per backend (0: none), and
    # the host<->GPU copy bandwidth its copies are charged at (GB/s, one direction): measured
    # on the H200 with the tier's batched copies, 33B pools, 64 blocks each way: 51.3 (bf16),
    # 49.4 (fp8), 48.1 (int4-fp8) (`python -m bench.engine.host_tier --copy-rate`)
    host_kv_gib: float = 0.0
    host_copy_gbps: float = 50.0
    # prefill budget by backlog (scheduler.step_plan.PrefillCap; off by default)
    prefill_cap: PrefillCap = field(default_factory=PrefillCap)
    # TTFT / TPOT targets per class (scheduler.slo): per-class attainment in the report, and
    # with `admission`, the gateway's admission (scheduler.admission) refuses what its
    # prediction says would miss its TTFT target, as `tidegate serve --slo-ttft-ms` does
    slo: SLOTargets = field(default_factory=SLOTargets)
    admission: bool = False
    # the backends' waiting queue by class (SchedulerConfig.waiting_by_class: the echo engine's)
    waiting_by_class: bool = False
    slot_model: bool = False  # admission's slot model (scheduler.admission, "Slots")
    compete_window: bool = False  # AdmissionConfig.compete_window (`--compete-window`)
    # AdmissionConfig.retry_after_quantile (`--retry-after-quantile`)
    retry_after_quantile: float | None = None
    # admission's gap model projects the higher classes' arrivals that pass a waiting request
    # (AdmissionConfig.class_ordered, `--overtake`): only with `waiting_by_class` backends
    overtake: bool = False
    overtake_horizon_s: float | None = None  # AdmissionConfig.overtake_horizon_s
    # AdmissionConfig.normal_overtake_quantile (`--normal-overtake-quantile`)
    normal_overtake_quantile: float | None = None
    fleet_arrival_rate: bool = False  # AdmissionConfig.fleet_arrival_rate (`--fleet-arrival-rate`)
    # the backends' deadline order on the TTFT deadlines (arrival + the TTFT target, as
    # `tidegate serve --send-deadlines` sends them): SchedulerConfig.deadline_order /
    # deadline_margin_s (`tidegate backend --deadline-order`; scheduler.deadline_order)
    deadline_order: bool = False
    deadline_margin_s: float = DEFAULT_MARGIN_S

    def prefix_caching_for(self, workload: Workload) -> bool:
        """The setting resolved for `workload` (auto: does any request have a shared prefix?)."""
        if self.enable_prefix_caching is None:
            return bool(len(workload) and (workload.prefix_group >= 0).any())
        return self.enable_prefix_caching

    def scheduler_config(self, num_blocks: int, enable_prefix_caching: bool | None = None
                         ) -> SchedulerConfig:
        caching = self.enable_prefix_caching if enable_prefix_caching is None else enable_prefix_caching
        return SchedulerConfig(max_model_len=self.max_model_len, num_blocks=num_blocks,
                               max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=self.max_num_batched_tokens,
                               block_size=self.block_size,
                               enable_prefix_caching=bool(caching),
                               class_bounds=self.queue.class_bounds,
                               prefill_cap=self.prefill_cap,
                               waiting_by_class=self.waiting_by_class,
                               deadline_order=self.deadline_order,
                               deadline_margin_s=self.deadline_margin_s)


class GatewayAdapter:
    """Queues + batcher. `push`/`poll` return (flush_now, deadline); `spare` is the backends' load."""

    def __init__(self, config: SimSchedulerConfig, clock: ManualClock, workload: Workload,
                 lists: WorkloadLists | None = None):
        self.queues = ClassQueues(config.queue)
        self.batcher = DynamicWindowBatcher(config.batcher, clock, self.queues)
        self.idle_flush = config.batcher.idle_flush
        self._reported = False           # the spare-capacity state last told to the batcher
        self._w = workload
        self._class = bytearray(len(workload))  # int8 values; classes() views it
        self.lists = lists = lists if lists is not None else WorkloadLists(workload)
        self._prompt_len = lists.prompt_len
        self._output_len, self._priority = lists.output_len, lists.priority
        # each request's queue class, worked out once: the trace's, else by its max_tokens
        self._queue_class = _queue_classes(workload, config.queue.class_bounds)
        # the live gateway's admission (gateway.dispatcher.submit): the same objects
        self.admission = AdmissionControl(AdmissionConfig(slo=config.slo,
                                                          slot_model=config.slot_model,
                                                          compete_window=config.compete_window,
                                                          retry_after_quantile=config.retry_after_quantile,
                                                          class_ordered=(config.overtake
                                                                         and config.waiting_by_class),
                                                          overtake_horizon_s=config.overtake_horizon_s,
                                                          normal_overtake_quantile=(
                                                              config.normal_overtake_quantile),
                                                          fleet_arrival_rate=config.fleet_arrival_rate,
                                                          send_deadlines=config.deadline_order))
        self.predictor = self.admission.predictor
        # each request's TTFT deadline as the live gateway sends it (arrival + its target; 0:
        # none), read by the backends' deadline order (BackendAdapter.deadlines)
        self.deadlines: list[float] | None = None
        if config.deadline_order and config.slo.any_ttft:
            own = workload.ttft_override_ms
            arrival = workload.arrival_time.tolist()
            self.deadlines = [0.0] * len(workload)
            for i, c in enumerate(self._queue_class):
                t = config.slo.ttft_s(int(c), None if own is None else own[i])
                if t is not None:
                    self.deadlines[i] = arrival[i] + t
        self.admits = config.admission and config.slo.any_ttft
        self.retry_after: dict[int, float] = {}  # refused request -> its predicted TTFT
        # request -> (predicted TTFT, calibration margin) at its admission check, s
        self.predictions: dict[int, tuple[float, float]] = {}

    @property
    def num_pending(self) -> int:
        return self.queues.size

    def _report(self, spare: bool) -> None:
        if self.idle_flush and spare != self._reported:
            self.batcher.notify_idle(spare)
            self._reported = spare

    def push(self, i: int, now: float, spare: bool):
        qclass = self._queue_class[i]
        self._class[i] = qclass
        if self.idle_flush and spare != self._reported:  # _report(spare), inlined
            self.batcher.notify_idle(spare)
            self._reported = spare
        if self.admits:
            depth = self.queues.depth
            w = self._w
            own = w.ttft_override_ms
            adm = self.admission
            refusal = adm.check(int(qclass), [depth(c) for c in range(len(QueueClass))],
                                self.batcher.predicted_wait(now),
                                None if own is None else own[i], now=now)
            if adm.last_predicted_s is not None:
                self.predictions[i] = (adm.last_predicted_s, adm.last_margin_s)
            if refusal is not None:
                self.retry_after[i] = refusal.retry_after_s
            if w.forced_refused is not None:  # follow the live decision (its own is recorded)
                refusal = (refusal or Refusal(int(qclass), 0.0, 0.0)) if w.forced_refused[i] else None
            if refusal is not None:
                dec = self.batcher.poll()
                return Decision(dec.flush_now, dec.deadline, refusal)
        return self.batcher.push(PendingRequest(str(i), self._prompt_len[i], self._output_len[i],
                                                now, qclass, self._priority[i], None, i))

    def poll(self, spare: bool):
        self._report(spare)
        return self.batcher.poll()

    def take_batch(self) -> list[int]:
        batch = self.batcher.take_batch()
        self._reported = False           # a flush consumes the batcher's spare report
        return [r.payload for r in batch]

    def classes(self) -> np.ndarray:
        return np.frombuffer(self._class, dtype=np.int8).copy()

    def queue_class(self, i: int) -> int:
        """Request i's queue class (known before it arrives: the trace's, else by max_tokens)."""
        return int(self._queue_class[i])


def _queue_classes(workload: Workload, bounds: tuple[int, int]) -> list[QueueClass]:
    """Each request's QueueClass: the trace's when it gives one (>= 0), else the class of its
    max_tokens (`QueueConfig.classify`)."""
    given = workload.queue_class.astype(np.int64)
    if len(given) and given.max() > max(QueueClass):
        raise ValueError(f"queue class {int(given.max())} is not one of "
                         f"{', '.join(str(int(c)) for c in QueueClass)}")
    by_tokens = np.where(workload.output_len <= bounds[0], 0,
                         np.where(workload.output_len <= bounds[1], 1, 2))
    members = tuple(QueueClass)
    return [members[c] for c in np.where(given >= 0, given, by_tokens).tolist()]


class BackendAdapter:
    """One backend's StepScheduler; the simulator's stand-in runner."""

    def __init__(self, config: SimSchedulerConfig, num_blocks: int, workload: Workload,
                 lists: WorkloadLists | None = None, host: HostTierCost | None = None):
        if num_blocks < 1:
            raise ValueError("the model's weights leave no memory for the KV cache on this GPU")
        self.prefix_caching = config.prefix_caching_for(workload)
        sched_config = config.scheduler_config(num_blocks, self.prefix_caching)
        if host is not None:
            if not self.prefix_caching:
                raise ValueError("the host KV tier needs prefix caching (--prefix-caching on)")
            sched_config = replace(sched_config, num_host_blocks=host.num_blocks)
        self.sched = StepScheduler(sched_config)
        self.bm = self.sched.block_manager
        self.host = host
        if host is not None:
            self.sched.swap_cost = host.swap_cost
            self.bm.load_host_hits = host.swap_cost.should_load(config.block_size)
        self.max_num_seqs = config.max_num_seqs
        self._w = workload
        lists = lists if lists is not None else WorkloadLists(workload)
        self._prompt_len, self._output_len, self._priority = (lists.prompt_len, lists.output_len,
                                                              lists.priority)
        self._prefixes: dict[int, list[int]] = {}
        self._zeros: dict[int, list[int]] = {}  # prompt_tokens with prefix caching off
        self.num_rejected = 0
        self._still_prefilling = False
        # (past_finishes, k) of the last decode_stretch(): advance() passes k on as what
        # max_pure_decode_steps allows, as long as nothing reached the scheduler in between
        self._stretch_allowed: tuple[bool, int] | None = None
        self.block_size = config.block_size
        # what a LoadReport would say this backend's prefix cache holds (as the live worker does)
        self.prefix_summary = PrefixSummary(config.block_size) if self.prefix_caching else None
        self._group_hashes: dict[int, tuple[int, ...]] = {}
        # agent traces: prompt tokens found cached per finished request (shared list, set by
        # the event loop; None: not recorded), pins refused for the budget
        self.cached_of: list[int] | None = None
        self.num_pins_refused = 0
        # each request's TTFT deadline (GatewayAdapter.deadlines, set by the event loop) and
        # whether this backend orders by them (SchedulerConfig.deadline_order)
        self.deadlines: list[float] | None = None
        self.deadline_order = config.deadline_order

    # ---- load, as a LoadReport would carry it ------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.sched.waiting)

    @property
    def num_running(self) -> int:
        return len(self.sched.running)

    @property
    def has_room(self) -> bool:
        return len(self.sched.running) < self.max_num_seqs

    @property
    def kv_usage(self) -> float:
        return self.bm.usage

    def fragmentation(self) -> float:
        return self.sched.internal_fragmentation()

    # ---- requests ----------------------------------------------------------------------------
    def prompt_tokens(self, i: int) -> list[int]:
        """Request i's prompt token ids. With prefix caching off, one shared list per length
        (the scheduler copies a prompt, never changes it): do not mutate the result."""
        w = self._w
        n = self._prompt_len[i]
        if w.prompt_ids is not None and self.prefix_caching:  # an agent trace's own ids
            return w.prompt_ids(i)
        if not self.prefix_caching:  # allocation is by count: the values never matter
            zeros = self._zeros.get(n)
            if zeros is None:
                zeros = self._zeros[n] = [0] * n
            return zeros
        base = (i + 1) * _TOKEN_STRIDE
        g = int(w.prefix_group[i])
        if g < 0:
            return list(range(base, base + n))
        plen = int(w.prefix_len[i])
        prefix = self._prefixes.get(g)
        if prefix is None or len(prefix) < plen:
            prefix = self._prefixes[g] = list(range(-(g + 1) * _TOKEN_STRIDE,
                                                    -(g + 1) * _TOKEN_STRIDE + plen))
        return prefix[:plen] + list(range(base + plen, base + n))

    def prefix_hashes(self, i: int) -> tuple[int, ...]:
        """Request i's prompt prefix hashes, as the gateway computes them for placement (() with
        prefix caching off: nothing can be reused, so nothing is hashed). A shared prefix that
        covers every sampled depth hashes the same for its whole group: computed once."""
        if not self.prefix_caching:
            return ()
        g = int(self._w.prefix_group[i])
        deep = g >= 0 and int(self._w.prefix_len[i]) > DEPTHS[-1] * self.block_size
        if deep:
            h = self._group_hashes.get(g)
            if h is not None:
                return h
        h = prefix_hashes(self.prompt_tokens(i), self.block_size)
        if deep:
            self._group_hashes[g] = h
        return h

    def prefix_report(self) -> list[int]:
        """The LoadReport's prefix summary: sampled-depth hashes this backend still caches."""
        return self.prefix_summary.snapshot(self.bm.is_cached) if self.prefix_summary else []

    def add(self, i: int, now: float) -> bool:
        self._stretch_allowed = None
        tokens = self.prompt_tokens(i)
        dl = self.deadlines
        rej = self.sched.add_request(str(i), tokens, self._output_len[i], now, self._priority[i],
                                     dl[i] if dl is not None else 0.0)
        if rej is not None:
            self.num_rejected += 1
            return False
        if self.prefix_summary is not None:
            self.prefix_summary.add_prompt(tokens)
        pins = self._w.pins
        # a pin of its prefix (scheduler.block_manager), refused over the budget
        if pins is not None and pins[i][0] > 0 and not self.bm.request_pin(
                str(i), tokens, pins[i][0], pins[i][1]):
            self.num_pins_refused += 1
        return True

    # ---- steps -------------------------------------------------------------------------------
    def schedule(self, now: float | None = None, step_s: float = 0.0):
        """Plan one step; None when there is nothing to run. Returns the plan's cost arguments.

        The decodes stay unlisted (`schedule(list_decodes=False)`): a step costs O(prefill
        chunks + block boundaries + completions), not O(running)."""
        sched = self.sched
        self._stretch_allowed = None
        plan = sched.schedule(list_decodes=False, now=now if self.deadline_order else None,
                              step_s=step_s)
        num_decode = plan.num_unlisted_decodes
        if not num_decode and not plan.chunks:
            return None
        num_prefill = 0
        d = sched.decodes  # num_decode_context_tokens, read without two property calls
        num_ctx = d.offset_sum + d.num_decoding * d.step + num_decode  # each reads its context + 1
        partial = False
        for c in plan.chunks:
            n = len(c.token_ids)
            num_ctx += c.start_pos + n
            num_prefill += n
            partial = partial or not c.sample
        self._plan = plan
        # A prefill chunk that does not end its prompt leaves that sequence prefilling after the
        # step, and then max_pure_decode_steps() is 0 by definition: skip the call.
        self._still_prefilling = partial
        return num_decode, num_prefill, num_ctx

    def decode_contexts(self, ahead: int = 0) -> list[tuple[int, int]]:
        """(context the step reads, steps until it finishes) of every decoding sequence `ahead`
        steps after the next one, in running order (priority, arrival: the engine's plan order
        up to queue class): O(running), so only for a cost model that charges the contexts'
        spread (`ProfileCost.decode_context_multiple`)."""
        sched = self.sched
        step = sched.decodes.step
        return [(s._computed + step + ahead + 1, s.finish_step - step) for s in sched.running
                if s.decoding]

    @property
    def prefill_chunks(self) -> list:
        """The prefill chunks of the step `schedule()` just planned (decodes are unlisted): for cost
        models that charge each packed prompt by itself (`accepts_prefill_chunks`)."""
        return self._plan.chunks

    @property
    def preempted(self) -> list[str]:
        """The request ids the step `schedule()` just planned sent back to waiting."""
        return self._plan.preempted

    def complete_step(self, _costs) -> tuple[list[int], list[int]]:
        """Feed back the step's synthetic result -> (requests with a first token, finished)."""
        plan, self._plan = self._plan, None
        sampled = {}
        firsts = []
        for c in plan.chunks:  # prefill chunks only; the unlisted decodes sample token 0
            if c.sample:
                sampled[c.request_id] = 0
                firsts.append(int(c.request_id))
        done = self.sched.update(plan, StepResult(sampled, _NO_STOPS))
        if self.cached_of is not None:
            for f in done:
                self.cached_of[int(f.request_id)] = f.num_cached_tokens
        return firsts, [int(f.request_id) for f in done]

    def decode_stretch(self, max_steps: int, max_finishes: int) -> tuple[int, list[tuple]]:
        """The next stretch of pure decode steps, as (k, segments), k = 0 when there is none.

        With `max_finishes` > 0 the stretch may run past up to that many finishing steps (it
        may end on one more); otherwise it ends at the first. Segments cover the k steps in
        order, one per run of steps with the same batch: ``(num_steps, num_decode_seqs,
        num_context_tokens of the first, num_finishing after the last, their prompt + output
        tokens)``; a segment's context grows by its batch each step."""
        if self._still_prefilling:
            return 0, []
        sched = self.sched
        decodes = sched.decodes
        past = max_finishes > 0
        if past:
            finishing = decodes.finishing
            step = decodes.step
            keys = sorted(finishing)
            if max_finishes < len(keys):
                keys = keys[:max_finishes + 1]
                max_steps = min(max_steps, keys[-1] - step)
        k = sched.max_pure_decode_steps(past, max_steps)
        if k < 1:
            return 0, []
        self._stretch_allowed = (past, k)
        n = decodes.num_decoding
        off = decodes.offset_sum
        if not past:
            return k, [(k, n, off + n * (decodes.step + 1), 0, 0)]
        segs = []
        a = 0
        for f in keys:
            b = f - step
            if b > k:
                break
            bucket = finishing[f]
            segs.append((b - a, n, off + n * (step + a + 1), len(bucket),
                         sum(q.num_prompt_tokens + q.max_tokens for q in bucket)))
            n -= len(bucket)
            for q in bucket:  # a decoding sequence's offset against the clock
                off -= q.num_computed_tokens - step
            a = b
        if a < k:
            segs.append((k - a, n, off + n * (step + a + 1), 0, 0))
        return k, segs

    def advance(self, k: int, past_finishes: bool = False) -> list[int]:
        known, self._stretch_allowed = self._stretch_allowed, None
        allowed = known[1] if known is not None and known[0] == past_finishes else None
        done = self.sched.advance_decode_steps(k, past_finishes=past_finishes, allowed=allowed)
        if self.cached_of is not None:
            for f in done:
                self.cached_of[int(f.request_id)] = f.num_cached_tokens
        return [int(f.request_id) for f in done]

    def take_copy_seconds(self) -> float:
        """Time of the tier copies queued since the last call (the engine runs them before the
        step's forward pass, on their own stream but not overlapped with it: charged in full)."""
        if self.host is None:
            return 0.0
        return len(self.bm.host.take_copies()) * self.host.copy_s_per_block

    def stats(self) -> dict:
        out = asdict(self.sched.stats())
        out["num_rejected"] = self.num_rejected
        if self.host is not None:
            tier = self.bm.host
            out["host_kv_peak_gib"] = tier.max_used_blocks * self.host.block_bytes / 2**30
            out["host_kv_blocks"] = tier.num_blocks
            out["host_saved_blocks"] = tier.num_saved_blocks
            out["host_loaded_blocks"] = tier.num_loaded_blocks
            out["host_dropped_blocks"] = tier.num_dropped_blocks
        return out


@dataclass(frozen=True)
class HostTierCost:
    """The host tier of one simulated backend: its size and what its copies cost."""
    num_blocks: int
    block_bytes: int
    copy_bytes_per_s: float
    prefill_s_per_token: float  # what a recompute costs per token (the swap rule's other side)

    @property
    def copy_s_per_block(self) -> float:
        return self.block_bytes / self.copy_bytes_per_s

    @property
    def swap_cost(self) -> SwapCostModel:
        return SwapCostModel(self.block_bytes, self.copy_bytes_per_s, self.prefill_s_per_token)

    @classmethod
    def for_cost_model(cls, config: SimSchedulerConfig, cost, prefill_tokens: int = 2048
                       ) -> HostTierCost | None:
        """From the run's settings and cost model (None without a tier): block bytes from the
        cost model's KV bytes per token, the recompute rate from its step time of a prefill."""
        if config.host_kv_gib <= 0:
            return None
        per_token = getattr(cost, "kv_bytes_per_token", None)
        if per_token is None:
            raise ValueError("the host KV tier needs a cost model that knows the KV bytes per "
                             "token (the roofline model)")
        block_bytes = int(per_token * config.block_size)
        prefill_s = cost.step_time(0, prefill_tokens, prefill_tokens) / prefill_tokens
        return cls(int(config.host_kv_gib * 2**30) // block_bytes, block_bytes,
                   config.host_copy_gbps * 1e9, prefill_s)
