"""Command-line options shared by `sim run`, `sweep` and `search`, and the TOML config file.

A TOML file (`--config FILE`) gives defaults for any option, by its long name with `-` or `_`,
at the top level or inside any table (tables are only for grouping)::

    model = "deepseek-coder-33b"
    [workload]
    rate = 20
    input-len = "lognormal:512:0.6"
    [batcher]
    min-latency-ms = 2.0

Flags given on the command line win over the file.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import tomllib

from scheduler.admission import add_overtake_arguments
from scheduler.batcher import BatcherConfig
from scheduler.capacity import (
    add_capacity_arguments,
    add_prefill_cap_arguments,
    prefill_cap_from_args,
)
from scheduler.deadline_order import add_deadline_order_arguments, deadline_order_from_args
from scheduler.placement import add_placement_arguments, placement_config_from_args
from scheduler.queues import QueueConfig
from scheduler.slo import SLOTargets, parse_targets
from sims.adapters import SimSchedulerConfig
from sims.cost import RooflineConfig
from sims.event_loop import EngineConfig
from sims.runner import CostSpec, RunSpec
from sims.workload import LengthSpec, WorkloadConfig, load_trace


def add_run_args(p: argparse.ArgumentParser, *, num_requests: int = 1000) -> None:
    p.add_argument("--config", help="TOML file with defaults for any of these options")
    g = p.add_argument_group("model and hardware")
    g.add_argument("--model", default="deepseek-coder-6.7b", help="preset name or config.json path")
    g.add_argument("--gpu", default="h200", help="h200 | h100 | a100")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per backend")
    g.add_argument("--weight-dtype", default="bf16", help="bf16 | fp8 | fp16 | fp32")
    g.add_argument("--kv-dtype", default="bf16", help="bf16 | fp8 | int4-fp8 | fp32")
    g.add_argument("--overhead-ms", type=float, default=0.5, help="fixed cost per step")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--interconnect", default="nvlink", help="nvlink | pcie (TP all-reduces)")
    g.add_argument("--profile", help="measured cost model: a `tidegate backend profile` JSON")
    g.add_argument("--profile-terms", choices=("auto", "off"), default="auto",
                   help="with --profile: charge its steps as the engine that measured it runs them, "
                        "the terms `sim validate` scores (auto, the default: the async loop's hidden "
                        "launch and plan leads on a CUDA profile, the power cap where it has the pause "
                        "check, by step kind where it has the mixed step's sustained run; "
                        "sims.profile_terms); off: the bare profile")
    g.add_argument("--step-ms", type=float, help="constant step time instead of a cost model")
    g.add_argument("--num-blocks", type=int, help="KV blocks per backend (default: from memory)")
    g = p.add_argument_group("workload")
    g.add_argument("--backends", type=int, default=1, help="number of backends")
    g.add_argument("--rate", type=float, default=10.0, help="arrival rate, requests/s")
    g.add_argument("--num-requests", type=int, default=num_requests)
    g.add_argument("--arrival", default="poisson", help="poisson | gamma | trace")
    g.add_argument("--cv", type=float, default=1.0, help="gamma inter-arrival coefficient of variation")
    g.add_argument("--input-len", default="512", help="N | uniform:LO:HI | lognormal:MEDIAN:SIGMA[:MAX] | trace")
    g.add_argument("--output-len", default="128", help="as --input-len")
    g.add_argument("--trace", help="JSONL trace (arrival_time, prompt_tokens, output_tokens, class)")
    g.add_argument("--shared-prefix-fraction", type=float, default=0.0)
    g.add_argument("--shared-prefix-len", type=int, default=0)
    g.add_argument("--num-prefix-groups", type=int, default=1)
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("gateway batcher")
    d = BatcherConfig()
    g.add_argument("--max-batch-size", type=int, default=d.max_batch_size)
    g.add_argument("--min-latency-ms", type=float, default=d.min_latency_ms)
    g.add_argument("--target-throughput", type=float, default=d.target_throughput)
    g.add_argument("--hysteresis", type=float, default=d.hysteresis)
    g.add_argument("--no-idle-flush", dest="idle_flush", action="store_false", default=True)
    g.add_argument("--message-cost-us", default="0,0", metavar="GATEWAY,BACKEND",
                   help="host CPU per Batch message, microseconds: the gateway's (one thread) and "
                        "the backend's (added to its next step); what a window saves. Measured on "
                        "the 2-core CPU box: 350,250 (docs/window_defaults.md)")
    g = p.add_argument_group("backend scheduler")
    add_capacity_arguments(g)
    add_prefill_cap_arguments(g)
    g.add_argument("--max-model-len", type=int, help="default: the model's max positions")
    g.add_argument("--waiting-by-class", action="store_true",
                   help="the backends admit waiting requests Fast first (the echo engine's "
                   "order; default FCFS, our engine's)")
    g.add_argument("--slot-model", action="store_true",
                   help="admission's slot model, as `tidegate serve --slot-model`")
    add_deadline_order_arguments(g)
    g.add_argument("--compete-window", action="store_true",
                   help="as `tidegate serve --compete-window` (AdmissionConfig.compete_window)")
    g.add_argument("--retry-after-quantile", type=float, default=None, metavar="Q",
                   help="as `tidegate serve --retry-after-quantile` "
                   "(AdmissionConfig.retry_after_quantile)")
    add_overtake_arguments(g)
    g.add_argument("--prefix-caching", choices=("auto", "on", "off"), default="auto",
                   help="auto: on only when the workload shares prefixes (the simulator's generated "
                        "tokens are dummies, so nothing else hits; see sims.adapters)")
    g.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_const", const="off")
    g.add_argument("--host-kv-gib", type=float, default=0.0,
                   help="host-memory KV tier per backend, GiB (0: none): evicted prefix blocks and "
                        "swapped preempted sequences; needs prefix caching")
    g.add_argument("--host-copy-gbps", type=float, default=SimSchedulerConfig.host_copy_gbps,
                   help="host<->GPU copy bandwidth the tier's copies are charged at, GB/s one way "
                        "(default: measured on the H200 with batched copies; the backend logs "
                        "its own figure at start)")
    g.add_argument("--network-delay-ms", type=float, default=0.0)
    g.add_argument("--delivery-delay-ms", type=float, default=0.0,
                   help="backend -> client delay of every token (TTFT and E2E grow by it, TPOT "
                        "does not); `tidegate sim validate` prints the live figure (HTTP in + out)")
    g.add_argument("--delivery-per-stream-ms", type=float, default=0.0,
                   help="and this much more per stream (decodes + prefill chunks) of the token's "
                        "step: the gateway's and the client's work on every stream's token (H200: "
                        "~0.07 ms; `tidegate sim validate` fits it from the live path)")
    add_placement_arguments(g)
    g.add_argument("--max-stretch-steps", type=int, default=1 << 30,
                   help="cap on steps advanced in one event (1: step by step)")
    g = p.add_argument_group("output")
    g.add_argument("--slo-ttft-ms", metavar="MS|CLASS=MS,...",
                   help="goodput SLO on time to first token, for every class or per class "
                        "(fast=200,normal=1000,slow=4000: scheduler.slo)")
    g.add_argument("--slo-tpot-ms", metavar="MS|CLASS=MS,...",
                   help="goodput SLO on time per output token, as --slo-ttft-ms")
    g.add_argument("--admission", action="store_true",
                   help="run the gateway's admission (scheduler.admission): refuse a request "
                        "whose predicted TTFT passes its class's --slo-ttft-ms, as `tidegate "
                        "serve` does whenever it has a TTFT target")
    g.add_argument("--json", dest="json_out", metavar="OUT", help="write the report as JSON")
    g.add_argument("--plot", metavar="DIR", help="write PNG+SVG plots into DIR")


def parse_with_config(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    pre, _ = p.parse_known_args(argv)
    if getattr(pre, "config", None):
        with open(pre.config, "rb") as fh:
            doc = tomllib.load(fh)
        known = {a.dest for a in p._actions}
        flat: dict = {}

        def walk(d):
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(v)
                else:
                    flat[k.replace("-", "_")] = v
        walk(doc)
        aliases = {"no_idle_flush": ("idle_flush", lambda v: not v),
                   "no_prefix_caching": ("prefix_caching", lambda v: "off" if v else "auto")}
        for k, (dest, f) in aliases.items():
            if k in flat:
                flat[dest] = f(flat.pop(k))
        unknown = sorted(set(flat) - known)
        if unknown:
            p.error(f"{pre.config}: unknown option(s) {', '.join(unknown)}")
        p.set_defaults(**flat)
    return p.parse_args(argv)


def prefix_caching_arg(value) -> bool | None:
    """'auto' | 'on' | 'off' (or a TOML bool) -> SimSchedulerConfig.enable_prefix_caching."""
    if isinstance(value, bool):
        return value
    return {"auto": None, "on": True, "off": False}[str(value).lower()]


def spec_from_args(a: argparse.Namespace) -> RunSpec:
    trace = load_trace(a.trace) if a.trace else None
    trace_in = tuple(int(x) for x in trace.prompt_len) if trace is not None else ()
    trace_out = tuple(int(x) for x in trace.output_len) if trace is not None else ()
    terms = profile_engine_terms(a)
    cost = CostSpec(model=a.model, gpu=a.gpu, profile=a.profile, step_ms=a.step_ms,
                    num_blocks=a.num_blocks, **terms["cost"],
                    roofline=RooflineConfig(weight_dtype=a.weight_dtype, kv_dtype=a.kv_dtype, tp=a.tp,
                                            interconnect=a.interconnect, overhead_s=a.overhead_ms / 1e3,
                                            gpu_memory_utilization=a.gpu_memory_utilization))
    workload = WorkloadConfig(
        num_requests=a.num_requests, rate=a.rate,
        arrival=a.arrival,
        cv=a.cv, input_len=LengthSpec.parse(a.input_len, trace_in),
        output_len=LengthSpec.parse(a.output_len, trace_out),
        shared_prefix_fraction=a.shared_prefix_fraction, shared_prefix_len=a.shared_prefix_len,
        num_prefix_groups=a.num_prefix_groups, seed=a.seed)
    max_model_len = a.max_model_len or cost.max_model_len()
    batcher = BatcherConfig(max_batch_size=a.max_batch_size, min_latency_ms=a.min_latency_ms,
                            target_throughput=a.target_throughput, hysteresis=a.hysteresis,
                            idle_flush=a.idle_flush)
    sched = SimSchedulerConfig(batcher=batcher, queue=QueueConfig(), max_num_seqs=a.max_num_seqs,
                               max_num_batched_tokens=a.max_num_batched_tokens,
                               block_size=a.block_size, max_model_len=max_model_len,
                               enable_prefix_caching=prefix_caching_arg(a.prefix_caching),
                               host_kv_gib=a.host_kv_gib, host_copy_gbps=a.host_copy_gbps,
                               prefill_cap=prefill_cap_from_args(a, terms["device"]),
                               slo=SLOTargets.parse(a.slo_ttft_ms, a.slo_tpot_ms),
                               admission=bool(getattr(a, "admission", False)),
                               waiting_by_class=bool(getattr(a, "waiting_by_class", False)),
                               slot_model=bool(getattr(a, "slot_model", False)),
                               compete_window=bool(getattr(a, "compete_window", False)),
                               retry_after_quantile=getattr(a, "retry_after_quantile", None),
                               overtake=bool(getattr(a, "overtake", False)),
                               overtake_horizon_s=getattr(a, "overtake_horizon_s", None),
                               normal_overtake_quantile=getattr(a, "normal_overtake_quantile", None),
                               fleet_arrival_rate=bool(getattr(a, "fleet_arrival_rate", False)),
                               **deadline_order_from_args(a))
    if not (math.isfinite(a.delivery_delay_ms) and a.delivery_delay_ms >= 0):
        raise ValueError(f"--delivery-delay-ms must be >= 0, got {a.delivery_delay_ms}")
    per_stream_ms = getattr(a, "delivery_per_stream_ms", 0.0)
    if not (math.isfinite(per_stream_ms) and per_stream_ms >= 0):
        raise ValueError(f"--delivery-per-stream-ms must be >= 0, got {per_stream_ms}")
    gw_us, be_us = parse_message_cost(a.message_cost_us)
    engine = EngineConfig(num_backends=a.backends, network_delay_s=a.network_delay_ms / 1e3,
                          gateway_message_s=gw_us / 1e6, backend_message_s=be_us / 1e6,
                          delivery_delay_s=a.delivery_delay_ms / 1e3,
                          delivery_per_stream_s=per_stream_ms / 1e3,
                          max_stretch_steps=a.max_stretch_steps,
                          placement=placement_config_from_args(a, a.block_size), **terms["engine"])
    return RunSpec(cost=cost, workload=workload, scheduler=sched, engine=engine, trace=a.trace,
                   slo_ttft_ms=uniform_target(a.slo_ttft_ms),
                   slo_tpot_ms=uniform_target(a.slo_tpot_ms))


def profile_engine_terms(a: argparse.Namespace) -> dict:
    """`sims.profile_terms.engine_terms` of --profile unless --profile-terms off (or no profile, or
    a constant --step-ms): {"cost": ..., "engine": ..., "device": the engine's device, whose
    default prefill cap the scheduler takes}."""
    none = {"cost": {}, "engine": {}, "device": "cpu"}
    if not a.profile or a.step_ms is not None or getattr(a, "profile_terms", "auto") == "off":
        return none
    from sims.profile_terms import engine_terms
    try:
        doc = json.loads(Path(a.profile).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--profile {a.profile}: {exc}") from None
    return engine_terms(doc) if isinstance(doc, dict) else none


def uniform_target(text) -> float | None:
    """The one target of '500' (every class); None for none or for per-class targets (those
    reach the report through `SimSchedulerConfig.slo`)."""
    targets = parse_targets(text)
    return targets[0] if len(set(targets)) == 1 else None


def parse_message_cost(text) -> tuple[float, float]:
    """'GATEWAY,BACKEND' microseconds per message (one number: the gateway's, backend 0)."""
    parts = [float(x) for x in str(text).split(",")]
    if len(parts) == 1:
        parts.append(0.0)
    if len(parts) != 2 or not all(math.isfinite(x) and x >= 0 for x in parts):
        raise ValueError(f"--message-cost-us wants GATEWAY,BACKEND >= 0, got {text!r}")
    return parts[0], parts[1]


def parse_list(text: str | None, kind=float) -> list:
    """'1,2,4' -> [1, 2, 4]; 'geom:LO:HI:N' -> N geometric points; 'lin:LO:HI:N' -> linear."""
    if text is None:
        return []
    if isinstance(text, (list, tuple)):
        return [kind(x) for x in text]
    if str(text).startswith(("geom:", "lin:")):
        import numpy as np
        how, lo, hi, n = str(text).split(":")
        f = np.geomspace if how == "geom" else np.linspace
        return [kind(x) for x in f(float(lo), float(hi), int(n))]
    out = []
    for part in str(text).split(","):
        part = part.strip().lower()
        if kind is bool:
            out.append(part in ("1", "on", "true", "yes"))
        else:
            out.append(kind(part))
    return out
