"""From a `BackendConfig` (the CLI's options) to a ready `Engine`: load, size the KV pool, wire."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from backend.engine.continuous import Engine, EngineConfig
from backend.errors import ModelLoadError
from backend.kv.host_tier import HostKVCache
from backend.kv.pools import (
    KV_CACHE_DTYPES,
    KVCache,
    block_bytes,
    dtype_name,
    fill_bytes,
    num_blocks_for_memory,
    uses_fill_block,
)
from backend.kv.sizing import DEFAULT_KV_FRACTION
from backend.model.loader import LoadedModel, available_memory, load
from backend.runner.grammar import GrammarManager
from backend.runner.step import ModelRunner
from scheduler.capacity import DEFAULT_CAPACITY, PrefillCap
from scheduler.deadline_order import DEFAULT_MARGIN_S
from scheduler.speculation import SpeculationConfig

log = logging.getLogger("tidegate.backend")

DEFAULT_CPU_KV_BYTES = 256 << 20  # CPU default: at most 256 MiB of KV unless asked for more


@dataclass(frozen=True)
class BackendConfig:
    model: str = "tiny"                  # HF directory or preset name
    load_format: str = "auto"            # auto | dummy | safetensors
    device: str = "cpu"                  # cpu | cuda | cuda:N
    dtype: str = "auto"                  # auto | float32 | bfloat16 | float16
    max_model_len: int | None = None     # default: the model's max_position_embeddings
    block_size: int = DEFAULT_CAPACITY.block_size  # tokens per KV block
    num_blocks: int | None = None        # KV blocks; default: from kv_memory_fraction
    kv_memory_fraction: float | None = None  # share of free memory (after weights) for KV
    kv_cache_dtype: str = "auto"         # auto (model dtype) | fp8 | int4-fp8 (backend.kv.formats)
    max_num_seqs: int = DEFAULT_CAPACITY.max_num_seqs  # running sequences per step at most
    max_num_batched_tokens: int = DEFAULT_CAPACITY.max_num_batched_tokens  # tokens per step
    prefill_cap: PrefillCap = field(default_factory=PrefillCap)  # prefill per step while decoding
    enable_prefix_caching: bool = True
    host_kv_gib: float = 0.0             # host-memory KV tier (backend.kv.host_tier); 0: none
    # the waiting queue by class, Fast first (SchedulerConfig.waiting_by_class; --waiting-by-class)
    waiting_by_class: bool = False
    # deadline order (SchedulerConfig.deadline_order / deadline_margin_s; --deadline-order,
    # --deadline-margin-ms): a waiting request that would miss its TTFT deadline waiting for the
    # next free slot starts first where the class order's next one can wait
    deadline_order: bool = False
    deadline_margin_ms: float = DEFAULT_MARGIN_S * 1000
    seed: int = 0                        # dummy-weight seed
    cpu_threads: int | None = None       # torch intra-op threads on the CPU; default: half the cores
    echo_step_ms: float = 0.0            # --model echo: sleep per step (a slow, idle-CPU backend)
    # speculative decoding's server default (scheduler.speculation; `--speculation` flags of a
    # serving backend, on there by default); None: off
    speculation_config: SpeculationConfig | None = None

    def validate(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ModelLoadError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                                 f"got {self.kv_cache_dtype!r}")
        if self.block_size < 1 or (self.num_blocks is not None and self.num_blocks < 1):
            raise ModelLoadError("--block-size and --num-blocks must be >= 1")
        if self.kv_memory_fraction is not None and not 0 < self.kv_memory_fraction <= 1:
            raise ModelLoadError(f"--kv-memory-fraction must be in (0, 1], got {self.kv_memory_fraction}")
        if self.num_blocks is not None and self.kv_memory_fraction is not None:
            raise ModelLoadError("give --num-blocks or --kv-memory-fraction, not both")
        if self.host_kv_gib < 0 or (self.host_kv_gib and not self.enable_prefix_caching):
            raise ModelLoadError("--host-kv-gib must be >= 0 and needs prefix caching "
                                 "(the host tier holds prefix-cache blocks)")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ModelLoadError(f"--max-num-batched-tokens ({self.max_num_batched_tokens}) must be "
                                 f">= --max-num-seqs ({self.max_num_seqs})")


def size_kv_pool(cfg: BackendConfig, loaded: LoadedModel, max_model_len: int,
                 fill_slots: int | None = None) -> int:
    """Number of KV blocks: as given, or a share of the free memory left after the weights
    and the int4 keys' fill rows (`fill_slots`, default `fill_slots_for(cfg)`), never more
    than max_num_seqs full-length sequences need."""
    c = loaded.config
    dname = dtype_name(loaded.dtype)
    cap = cfg.max_num_seqs * -(-max_model_len // cfg.block_size) + 1
    if fill_slots is None:
        fill_slots = fill_slots_for(cfg)
    fill = fill_bytes(c, cfg.block_size, dname, fill_slots)
    if cfg.num_blocks is not None:
        num_blocks = cfg.num_blocks
        need = num_blocks * block_bytes(c, cfg.block_size, dname, cfg.kv_cache_dtype) + fill
        free = available_memory(loaded.device)
        if need > free:
            raise ModelLoadError(f"--num-blocks {num_blocks} needs {need / 2**30:.1f} GiB of KV cache "
                                 f"but {loaded.device} has {free / 2**30:.1f} GiB free")
        return num_blocks
    fraction = cfg.kv_memory_fraction or DEFAULT_KV_FRACTION[loaded.device.type]
    kv_bytes = int(fraction * available_memory(loaded.device))
    if cfg.kv_memory_fraction is None and loaded.device.type == "cpu":
        kv_bytes = min(kv_bytes, DEFAULT_CPU_KV_BYTES)
    kv_bytes -= fill
    num_blocks = min(cap, num_blocks_for_memory(c, cfg.block_size, dname, kv_bytes,
                                                cfg.kv_cache_dtype))
    if num_blocks < 1:
        raise ModelLoadError("no memory left for the KV cache after loading the weights")
    return num_blocks


def fill_slots_for(cfg: BackendConfig) -> int:
    """Fill-row slots for the KV pools: one more than the sequences of a step (the runner's
    least recently used slot is then never one the step uses), for int4 keys; else 0."""
    return cfg.max_num_seqs + 1 if uses_fill_block(cfg.kv_cache_dtype) else 0


def default_cpu_threads() -> int:
    """Half the cores (at most 8): on a shared or small machine, OpenMP threads that wait for a
    busy core make every small matmul dozens of times slower than one thread."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


@dataclass(frozen=True)
class ServingOptions:
    """The serving-time transforms of a built runner, applied once by `build_runner`, in order:
    weight quantization (before the KV pool is sized), then the step CUDA graphs
    (`backend.runner.serving.configure_serving`)."""
    quantization: str = "none"
    enforce_eager: bool = False
    cuda_graph_buckets: str | None = None        # "1,2,4-64" (`cuda_graphs.parse_buckets`)
    cuda_graph_token_buckets: str | None = None
    # capture every graph now (a server's start-up: no capture stalls while serving), or each
    # at its first use (tests, benchmarks that use a few shapes)
    capture: bool = False
    async_scheduling: bool | None = None         # None: where the device runs asynchronously
    # fp8 weights: the most rows a linear runs on the weight-only GEMV before per-token fp8 + _scaled_mm
    # (`backend.kernels.fp8_gemv.FP8_GEMV_MAX_M`; None: that default). One switch per process.
    fp8_gemv_max_m: int | None = None


def _fp8_gemv_switch(serving: ServingOptions) -> dict:
    """Apply `serving.fp8_gemv_max_m` (before any graph is captured: a graph keeps the path it was
    captured with) and return it for the serving info, which profiles record: a profile's step times
    hold only for the switch they were measured at. {} without fp8 weights."""
    if (serving.quantization or "none") != "fp8":
        return {}
    from backend.kernels import fp8_gemv

    if serving.fp8_gemv_max_m is not None:
        fp8_gemv.set_gemv_max_m(serving.fp8_gemv_max_m)
    return {"fp8_gemv_max_m": fp8_gemv.FP8_GEMV_MAX_M}


def build_runner(cfg: BackendConfig, serving: ServingOptions = ServingOptions(), group=None,
                 ) -> tuple[ModelRunner, LoadedModel, dict, HostKVCache | None]:
    """The one place a serving runner is built: load (this rank's shard when `group`, a
    `backend.distributed.group.TPGroup`, is given), size and allocate the KV pool, the runner,
    the CPU kernels, the host tier, then the serving transforms. Returns (runner, loaded,
    serving info for the start-up line, host tier or None)."""
    from backend.runner.cuda_graphs import parse_buckets
    from backend.runner.serving import configure_serving, quantize_weights

    cfg.validate()
    if serving.fp8_gemv_max_m is not None and (serving.quantization or "none") != "fp8":
        raise ModelLoadError("--fp8-gemv-max-m applies to fp8 weights only (--quantization fp8)")
    device = group.device if group is not None else torch.device(cfg.device)
    if device.type == "cpu":
        # tensor-parallel ranks on one host share its cores: each takes its share of the default
        share = group.size if group is not None else 1
        torch.set_num_threads(cfg.cpu_threads or max(1, default_cpu_threads() // share))
    loaded = load(cfg.model, cfg.load_format, cfg.dtype, str(device), cfg.seed, cfg.max_model_len,
                  tp=group)
    # Quantize before the pool is sized: the pool takes a share of the memory the device reports
    # free, and fp8 weights give back about half of the bf16 ones (sized after, the 33B fp8 on an
    # H100 had 3,452 blocks where ~10,400 fit).
    try:
        quantized = quantize_weights(loaded.model, serving.quantization, loaded.device)
        quantized.update(_fp8_gemv_switch(serving))
    except ValueError as exc:  # QuantizationError included
        raise ModelLoadError(str(exc)) from None
    max_model_len = cfg.max_model_len or loaded.config.max_position_embeddings
    if group is None:
        fill_slots = fill_slots_for(cfg)
        num_blocks = size_kv_pool(cfg, loaded, max_model_len)
    else:
        # every rank's pool has the blocks the smallest one can hold (block ids are shared); no
        # fill rows under tensor parallelism (not built), so none are set aside
        fill_slots = 0
        num_blocks = group.min_int(size_kv_pool(cfg, loaded, max_model_len, fill_slots=0))
    kv = KVCache.allocate(loaded.config, num_blocks, cfg.block_size, loaded.dtype, loaded.device,
                          cfg.kv_cache_dtype, fill_slots=fill_slots)
    # eager at first (on CUDA: the Triton kernels installed, no graphs): the graphs are set up
    # once, by configure_serving below, and capture the weights as quantized above
    runner = ModelRunner(loaded.model, kv, cfg.max_num_batched_tokens, cfg.max_num_seqs,
                         max_model_len, enforce_eager=True)
    # CUDA: the Triton kernels read and write every KV format (`backend.kernels.dispatch`). CPU:
    # the C kernels take fp32 model-dtype pages; quantized pools keep the torch reference
    # attention, which dequantizes the pages it reads (`backend.kernels.reference.attention`).
    if loaded.device.type == "cpu" and cfg.kv_cache_dtype == "auto":
        use_cpu_kernels(runner)
    host_kv = create_host_kv(kv, cfg.host_kv_gib)  # under TP: the same block count on every rank
    try:
        buckets = parse_buckets(serving.cuda_graph_buckets) \
            if serving.cuda_graph_buckets is not None else None
        token_buckets = parse_buckets(serving.cuda_graph_token_buckets) \
            if serving.cuda_graph_token_buckets is not None else None
        info = configure_serving(runner, "none", serving.enforce_eager, buckets,
                                 capture=serving.capture, token_buckets=token_buckets)
        info.update(quantization=serving.quantization or "none", **quantized)
    except ValueError as exc:  # QuantizationError included
        raise ModelLoadError(str(exc)) from None
    return runner, loaded, info, host_kv


def engine_config(cfg: BackendConfig, runner, host_kv) -> EngineConfig:
    return EngineConfig(max_model_len=runner.max_model_len, num_blocks=runner.kv.num_blocks,
                        block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
                        max_num_batched_tokens=cfg.max_num_batched_tokens,
                        prefill_cap=cfg.prefill_cap,
                        enable_prefix_caching=cfg.enable_prefix_caching,
                        waiting_by_class=cfg.waiting_by_class,
                        deadline_order=cfg.deadline_order,
                        deadline_margin_s=cfg.deadline_margin_ms / 1000,
                        num_host_blocks=host_kv.num_blocks if host_kv is not None else 0,
                        speculation=cfg.speculation_config)


def create_engine(cfg: BackendConfig, serving: ServingOptions = ServingOptions(),
                  ) -> tuple[Engine, LoadedModel]:
    """Every serving engine of one process is built here: `tidegate backend`, evaluation and the
    benchmarks call it (tensor-parallel ranks call `build_runner`). `engine.serving_info` holds
    what the serving transforms did, for the start-up line."""
    if cfg.model == "echo":  # no model: the serving path alone (backend/engine/echo.py)
        from backend.engine.echo import create_echo_engine

        return create_echo_engine(cfg)
    runner, loaded, info, host_kv = build_runner(cfg, serving)
    engine = Engine(runner, engine_config(cfg, runner, host_kv), eos_token_ids=_eos_ids(loaded),
                    host_kv=host_kv, async_scheduling=serving.async_scheduling)
    engine.serving_info = info
    if loaded.tokenizer.tokenizer_json:  # structured output (built at first use)
        # llguidance's mask threads: half the cores, up to 8 (one on this repo's 2-core CI)
        engine.grammars = GrammarManager(loaded.tokenizer.tokenizer_json,
                                         loaded.config.vocab_size, _eos_ids(loaded),
                                         num_threads=min(8, (os.cpu_count() or 2) // 2))
    if host_kv is not None:
        log.info("host KV tier: %d blocks (%.2f GiB%s), copies at %.2f GB/s measured",
                 host_kv.num_blocks, host_kv.nbytes / 2**30,
                 ", pinned" if loaded.device.type == "cuda" else "",
                 engine.scheduler.swap_cost.copy_bytes_per_s / 1e9)
    return engine, loaded


def create_host_kv(kv: KVCache, host_kv_gib: float):
    """The host tier's pool: as many blocks of the GPU pool's layout as `host_kv_gib` holds."""
    if not host_kv_gib:
        return None
    # imported here: it imports Triton (~0.9 s), which a CPU backend without a tier never needs
    from backend.kernels.block_gather import BlockGather

    per_block = kv.nbytes // kv.num_blocks
    num_host_blocks = int(host_kv_gib * 2**30) // per_block
    if num_host_blocks < 1:
        raise ModelLoadError(f"--host-kv-gib {host_kv_gib} holds no block ({per_block} bytes each)")
    return HostKVCache(kv, num_host_blocks, BlockGather)



def use_cpu_kernels(runner: ModelRunner) -> None:
    """On the CPU, attention and the elementwise ops run in C (`backend.kernels.cpu.attention`,
    `backend.kernels.cpu.ops`) where the kernels build; each falls back to the torch reference by
    itself for what it does not take."""
    from backend.kernels.cpu.attention import CpuAttention
    from backend.kernels.cpu.ops import CpuOps

    model = runner.model
    model.attn = CpuAttention(model.config.head_dim ** -0.5)
    model.ops = CpuOps()
    if not model.attn.uses_kernel:
        log.info("CPU kernels unavailable: torch reference attention and ops")
    from backend.kernels.cpu.linear import pack_linears

    pack_linears(model)  # bf16 models: the projections in oneDNN's packed layout


def _eos_ids(loaded: LoadedModel) -> tuple[int, ...]:
    ids = list(loaded.tokenizer.eos_token_ids)
    for e in loaded.config.eos_token_ids:
        if e not in ids:
            ids.append(e)
    return tuple(i for i in ids if 0 <= i < loaded.config.vocab_size)
