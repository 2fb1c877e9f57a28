"""Hybrid-parallelism planner: pipeline stages × tensor-parallel groups × replicas on N GPUs.

For each (tp, pp, dp) with tp·pp·dp = N (tp dividing the head counts), the L layers are split into
pp contiguous stages, balancing layer time against the embedding (first stage) and LM head (last
stage). A plan is rejected when a GPU's weights + activation reserve + the KV of the target load
exceed its memory. For decode at `batch` sequences of `context_len` tokens per replica, split into
pp micro-batches so the pipeline stays full:

  stage time t_s(m) = max(bytes_s / bandwidth, flops_s / peak) + 2·layers_s all-reduces (tp > 1)
                      (+ the embedding's all-reduce on the first stage, the logits' all-gather
                      on the last: what backend.server.ranks runs)
  pipeline tick τ   = max_s t_s(m) + send/recv of m×hidden activations (pp > 1)
  TPOT              = pp · τ                 (a token visits every stage)
  throughput        = dp · batch / TPOT      (tokens/s)
  TTFT (idle)       = Σ_s t_s(prefill of prompt_len) + (pp−1) sends

Bytes and FLOPs as in `sims.cost.RooflineCost`; all-reduce: ring over NVLink (tp groups live in one
node); send/recv over `interconnect` (NVLink or PCIe). With fewer KV heads than tp, each GPU holds
a copy of one KV head (its k/v projection rows and its KV cache), as backend.server.ranks does.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from sims.hardware import GpuSpec, allreduce_time, link, send_recv_time
from sims.model_shape import ModelShape, dtype_bytes


@dataclass(frozen=True)
class PlanConfig:
    batch: int = 64                  # concurrent sequences per replica
    context_len: int = 2048          # tokens per sequence (prompt + generated)
    prompt_len: int = 512            # for the idle TTFT estimate
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    interconnect: str = "nvlink"     # between pipeline stages
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 2 * 2**30
    overhead_s: float = 0.5e-3       # per step per stage


@dataclass
class Plan:
    num_gpus: int
    tp: int
    pp: int
    dp: int
    stage_layers: tuple[int, ...]
    fits: bool
    mem_per_gpu_gb: float            # of the most loaded GPU
    max_tokens_kv: int               # KV capacity per replica, tokens
    tpot_ms: float
    ttft_ms: float
    throughput_tok_s: float
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(num_layers: int, pp: int, head_layers: float) -> tuple[int, ...]:
    """Contiguous split minimizing the largest stage, counting the LM head as `head_layers`."""
    if pp == 1:
        return (num_layers,)
    best, best_cost = None, float("inf")
    for last in range(1, num_layers - pp + 2):
        rest, k = num_layers - last, pp - 1
        if rest < k:
            continue
        base, extra = divmod(rest, k)
        split = tuple([base + 1] * extra + [base] * (k - extra) + [last])
        cost = max(max(split[:-1]), last + head_layers)
        if cost < best_cost:
            best, best_cost = split, cost
    return best  # type: ignore[return-value]


class _StageCost:
    def __init__(self, shape: ModelShape, gpu: GpuSpec, cfg: PlanConfig, tp: int):
        self.shape, self.gpu, self.cfg, self.tp = shape, gpu, cfg, tp
        wb = dtype_bytes(cfg.weight_dtype)
        kv_shards = min(tp, shape.num_kv_heads)  # KV heads are replicated past this
        kv_proj = 2 * shape.hidden_size * shape.kv_size
        self.layer_bytes = ((shape.layer_params - kv_proj) / tp + kv_proj / kv_shards) * wb
        self.head_bytes = shape.vocab_size * shape.hidden_size * wb / tp
        self.kv_tok_layer = 2 * shape.kv_size * dtype_bytes(cfg.kv_dtype) / kv_shards
        self.peak = gpu.peak_flops(cfg.weight_dtype)
        self.ar_bw, self.ar_lat = link(gpu, "nvlink") if gpu.nvlink_bandwidth else link(gpu, "pcie")

    def weights(self, layers: int, first: bool, last: bool) -> float:
        emb = self.head_bytes if first else 0.0
        head = self.head_bytes if (last and not self.shape.tie_word_embeddings) or (last and not first) \
            else 0.0
        return layers * self.layer_bytes + emb + head

    def time(self, layers: int, last: bool, tokens: int, ctx_tokens: float, prefill: int = 0,
             first: bool = True, sampled: int | None = None) -> float:
        s = self.shape
        bytes_ = layers * self.layer_bytes + (self.head_bytes if last else 0.0) \
            + layers * self.kv_tok_layer * (ctx_tokens + tokens)
        flops = (2 * tokens * (layers * s.layer_params + (s.vocab_size * s.hidden_size if last else 0))
                 + 4 * layers * s.q_size * (ctx_tokens + prefill * prefill / 2)) / self.tp
        t = max(bytes_ / self.gpu.bandwidth, flops / self.peak) + self.cfg.overhead_s
        if self.tp > 1:
            ar = allreduce_time(tokens * s.hidden_size * 2.0, self.tp, self.ar_bw, self.ar_lat)
            t += (2 * layers + (1 if first else 0)) * ar  # o, down (+ the embedding lookup)
            if last:  # the sampled rows' logits, each GPU's vocabulary slice gathered
                rows = tokens if sampled is None else sampled
                t += self.ar_lat + (self.tp - 1) / self.tp * rows * s.vocab_size * 2.0 / self.ar_bw
        return t


def evaluate(shape: ModelShape, gpu: GpuSpec, num_gpus: int, tp: int, pp: int,
             cfg: PlanConfig = PlanConfig()) -> Plan:
    dp = num_gpus // (tp * pp)
    if shape.num_heads % tp or shape.num_kv_heads % tp and tp % shape.num_kv_heads:
        return Plan(num_gpus, tp, pp, dp, (), False, 0, 0, 0, 0, 0, f"tp={tp} does not divide the heads")
    if shape.intermediate_size % tp:
        return Plan(num_gpus, tp, pp, dp, (), False, 0, 0, 0, 0, 0,
                    f"tp={tp} does not divide intermediate_size")
    if pp > shape.num_layers:
        return Plan(num_gpus, tp, pp, dp, (), False, 0, 0, 0, 0, 0, "more stages than layers")
    sc = _StageCost(shape, gpu, cfg, tp)
    split = _splits(shape.num_layers, pp, sc.head_bytes / sc.layer_bytes)
    mem_cap = gpu.memory_bytes * cfg.gpu_memory_utilization - cfg.activation_reserve_bytes
    kv_need = cfg.batch * cfg.context_len
    worst_mem, kv_cap = 0.0, float("inf")
    for i, layers in enumerate(split):
        w = sc.weights(layers, i == 0, i == pp - 1)
        kv_per_tok = layers * sc.kv_tok_layer
        kv_cap = min(kv_cap, (mem_cap - w) / kv_per_tok if kv_per_tok else float("inf"))
        worst_mem = max(worst_mem, w + kv_per_tok * kv_need + cfg.activation_reserve_bytes)
    kv_cap = max(0, int(kv_cap))
    fits = kv_cap >= kv_need
    m = max(1, cfg.batch // pp)
    send_bw, send_lat = link(gpu, cfg.interconnect) if cfg.interconnect == "pcie" or gpu.nvlink_bandwidth \
        else link(gpu, "pcie")
    act = m * shape.hidden_size * 2.0
    stage_t = [sc.time(layers, i == pp - 1, m, m * cfg.context_len, first=i == 0)
               for i, layers in enumerate(split)]
    tau = max(stage_t) + (send_recv_time(act, send_bw, send_lat) if pp > 1 else 0.0)
    tpot = pp * tau
    ttft = sum(sc.time(layers, i == pp - 1, cfg.prompt_len, cfg.prompt_len, cfg.prompt_len,
                       first=i == 0, sampled=1)
               for i, layers in enumerate(split))
    ttft += (pp - 1) * send_recv_time(cfg.prompt_len * shape.hidden_size * 2.0, send_bw, send_lat)
    return Plan(num_gpus, tp, pp, dp, split, fits, worst_mem / 1e9, kv_cap, tpot * 1e3, ttft * 1e3,
                dp * cfg.batch / tpot if fits else 0.0,
                "" if fits else f"needs {kv_need} KV tokens, room for {kv_cap}")


def enumerate_plans(shape: ModelShape, gpu: GpuSpec, num_gpus: int,
                    cfg: PlanConfig = PlanConfig(), max_tp: int = 8) -> list[Plan]:
    plans = []
    for tp in _divisors(num_gpus):
        if tp > max_tp:
            continue
        for pp in _divisors(num_gpus // tp):
            plans.append(evaluate(shape, gpu, num_gpus, tp, pp, cfg))
    return plans


def best_plans(plans: list[Plan]) -> dict[str, Plan | None]:
    ok = [p for p in plans if p.fits]
    if not ok:
        return {"throughput": None, "latency": None}
    return {"throughput": max(ok, key=lambda p: (p.throughput_tok_s, -p.tpot_ms)),
            "latency": min(ok, key=lambda p: (p.tpot_ms, -p.throughput_tok_s))}
