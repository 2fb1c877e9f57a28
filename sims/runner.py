"""One simulated configuration as a picklable record, and the function that runs it.

`RunSpec` is what `sim run` builds from flags/TOML and what `sweep`/`search` vary; `run_spec` is
the unit of work the multiprocessing pool maps.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from scheduler.batcher import BatcherConfig
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost, CostModel, RooflineConfig, RooflineCost
from sims.event_loop import EngineConfig, SimResult, simulate
from sims.hardware import get_gpu
from sims.model_shape import load_model_shape
from sims.workload import WorkloadConfig, generate, load_trace


@dataclass(frozen=True)
class CostSpec:
    model: str = "deepseek-coder-6.7b"
    gpu: str = "h200"
    roofline: RooflineConfig = field(default_factory=RooflineConfig)
    profile: str | None = None          # a `tidegate backend profile` JSON: measured cost model
    step_ms: float | None = None        # constant step time (closed-form checks)
    num_blocks: int | None = None       # override the KV capacity
    # a profile's steps charged without the host's launch (the engine's async loop hides it;
    # sims.profile_cost): set with EngineConfig.async_plan_lead_s
    hide_launch: bool = False
    # the profile's power-cap model (its pause check; sims.profile_cost): prefill steps slowed by
    # the prefill share of the window before them
    power_cap: bool = False
    # with `power_cap`: each prefill step weighs in the busy share by its kind's power, where the
    # profile's pause check has the capped mixed step's sustained run (sims.profile_cost, "Power by
    # step kind"; opt-in)
    cap_by_power: bool = False
    # decode-only steps charged for their contexts' spread (sims.decode_spread): "measured" (at
    # the kappa of the profile's spread points; none without them), "off", or a kappa (what-if)
    decode_spread: str | float = "measured"
    # steps with prefill charged for their decodes' spread (sims.profile_cost, "Unequal contexts
    # beside a chunk"): "measured" (at the profile's mixed spread points' kappa; none without
    # them), "off", or a kappa (a what-if)
    mixed_spread: str | float = "measured"
    # with `cap_by_power`: a step with prefill counts the decode-only share before it at its own
    # weight (sims.profile_cost, "Decode spells"); False: the pause check's after-decode run only
    decode_spells: bool = True
    # the cached-prefix chunks' term (sims.profile_cost, "The prefix term from twins"): "twins" or
    # "fit" (as before session 26)
    prefix_term: str = "twins"
    # with `power_cap`: "slow" (the busy shares at the sustained trace's one time constant) or
    # "fast" (the limiter's fast onset apart; sims.profile_cost, "The limiter's onset")
    cap_onset: str = "slow"
    # with `power_cap`: the cap's ratios from the sustained runs ("sustained") or from the pause
    # check's device-time "stream_kind" runs ("stream"; sims.profile_cost, "Anchors in device time")
    cap_anchors: str = "sustained"
    # steps with prefill charged for their decodes' partial attention tiles: "measured" (the
    # default since session 35: the fraction of a tile the profile's tile-edge pairs measure; none
    # without them), "on" (whole tiles) or "off" (sims.profile_cost, "Whole tiles beside a chunk")
    mixed_tiles: str = "measured"
    # decode-only steps charged for their decodes' partial tiles: "measured" (the default, as
    # above), "off" or a fraction (a what-if)
    decode_tiles: str | float = "measured"

    def build(self) -> CostModel:
        if self.step_ms is not None:
            return ConstantCost(self.step_ms / 1e3, self.num_blocks or (1 << 20))
        if self.profile:
            from sims.profile_cost import ProfileCost
            cost = ProfileCost.from_json(self.profile, hide_launch=self.hide_launch,
                                           power_cap=self.power_cap, cap_by_power=self.cap_by_power,
                                           decode_spread=self.decode_spread, mixed_spread=self.mixed_spread,
                                           decode_spells=self.decode_spells, prefix_term=self.prefix_term,
                                           cap_onset=self.cap_onset, cap_anchors=self.cap_anchors,
                                           mixed_tiles=self.mixed_tiles, decode_tiles=self.decode_tiles)
        else:
            cost = RooflineCost(load_model_shape(self.model), get_gpu(self.gpu), self.roofline)
        if self.num_blocks:
            return _FixedBlocks(cost, self.num_blocks)
        return cost

    def max_model_len(self) -> int:
        try:
            return load_model_shape(self.model).max_model_len
        except (ValueError, OSError):
            return 16384


class _FixedBlocks:
    """A cost model with its KV capacity overridden."""

    def __init__(self, inner: CostModel, num_blocks: int):
        self.inner, self.blocks = inner, num_blocks
        self.step_time, self.decode_times = inner.step_time, inner.decode_times

    def __getattr__(self, name):
        # the rest of the inner model's interface (accepts_prefill_chunks, launch_time, ...):
        # without it a measured profile behind a KV override lost its per-chunk charging
        if name == "inner" or name.startswith("__"):  # unpickling: no inner yet
            raise AttributeError(name)
        return getattr(self.inner, name)

    def num_kv_blocks(self, block_size: int) -> int:
        return self.blocks

    def describe(self) -> dict:
        return {**getattr(self.inner, "describe", dict)(), "num_blocks": self.blocks}


@dataclass(frozen=True)
class RunSpec:
    cost: CostSpec = field(default_factory=CostSpec)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    scheduler: SimSchedulerConfig = field(default_factory=SimSchedulerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    trace: str | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None

    def with_batcher(self, **changes) -> RunSpec:
        batcher: BatcherConfig = replace(self.scheduler.batcher, **changes)
        return replace(self, scheduler=replace(self.scheduler, batcher=batcher))

    def describe(self) -> dict:
        b, s, w = self.scheduler.batcher, self.scheduler, self.workload
        return {"model": self.cost.model, "gpu": self.cost.gpu, "tp": self.cost.roofline.tp,
                "backends": self.engine.num_backends, "rate": w.rate, "num_requests": w.num_requests,
                "arrival": w.arrival, "cv": w.cv, "seed": w.seed,
                "max_batch_size": b.max_batch_size, "min_latency_ms": b.min_latency_ms,
                "target_throughput": b.target_throughput, "hysteresis": b.hysteresis,
                "idle_flush": b.idle_flush, "max_num_seqs": s.max_num_seqs,
                "max_num_batched_tokens": s.max_num_batched_tokens, "block_size": s.block_size,
                "enable_prefix_caching": ("auto" if s.enable_prefix_caching is None
                                          else s.enable_prefix_caching),
                "placement": self.engine.placement.policy,
                "message_cost_us": (self.engine.gateway_message_s * 1e6,
                                    self.engine.backend_message_s * 1e6)}


def simulate_spec(spec: RunSpec) -> SimResult:
    trace = load_trace(spec.trace) if spec.trace else None
    workload = generate(spec.workload, trace)
    return simulate(workload, spec.cost.build(), spec.scheduler, spec.engine)


def run_spec(spec: RunSpec) -> dict:
    """Simulate and summarize; the report carries its configuration under "config"."""
    from sims.report import summarize
    result = simulate_spec(spec)
    rep = summarize(result, slo_ttft_ms=spec.slo_ttft_ms, slo_tpot_ms=spec.slo_tpot_ms,
                    slo=spec.scheduler.slo)
    rep["config"] = spec.describe()
    return rep
