"""Weight-only FP8 (E4M3, per-output-channel fp32 scales) linear layers.

    w_fp8 [N, K] float8_e4m3fn, scale fp32 [N]:   w ~= w_fp8 * scale[:, None]
    y [M, N] = (x [M, K] @ w_fp8.T) * scale        fp32 accumulation, rounded to x's dtype

Small M (decode) is memory-bound on the weight: the Triton GEMV streams each fp8 weight byte once,
converts it in registers and accumulates in fp32; the output tile is transposed (w is the left
operand, [BLOCK_N, BLOCK_K] @ x^T [BLOCK_K, BLOCK_M]) so the wide weight tile feeds the tensor
cores and a padded M of 16 costs nothing extra in memory. Where N alone gives too few programs to
fill the chip, K is split and a second small kernel sums the fp32 partials:

    grid (n tiles, k splits, m tiles);   partials [split_k, M, N] fp32 -> sum -> y

Large M (prefill, big batches) goes to torch._scaled_mm with row-wise scales after a per-token
fp8 quantization of x (W8A8: the activation rounding is that path's own small error). The switch
is FP8_GEMV_MAX_M, set from the H200 measurement in bench/kernels/gpu_check.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.kernels.rmsnorm import fused_add_rms_norm_reference, rms_norm_reference
from backend.kernels.triton_utils import (
    HAS_TRITON,
    cdiv,
    next_power_of_2,
    num_sms,
    pdl_args,
    pdl_enter,
    tl,
    triton,
    use_triton,
)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# The Triton GEMV serves M <= FP8_GEMV_MAX_M; larger M goes to torch._scaled_mm. Measured on the
# H200 (bench/kernels/gpu_check.py, CUDA-graph timing, 33B qkv+o+gate_up+down per layer): the
# GEMV is faster than per-token quant + _scaled_mm up to M = 32 (280 vs 292 us), slower at 64
# (351 vs 257 us). The served steps disagree at 17-32 rows (bench/results/pairs_s39, section 2):
# in every FP8 profile a decode step of 33 sequences (48-row graph, _scaled_mm) is faster than one
# of 32 (32-row graph, GEMV), by 4-13 %. `--fp8-gemv-max-m 16` (set_gemv_max_m) moves 17-32 rows to
# _scaled_mm. Measured through the service on an H100 (bench/results/pairs_s40 and pairs_s41,
# `scripts/gpu_serving_run.sh WORKLOADS=fp8_switch`): decode steps of 17-24 / 25-32 sequences run
# 3.5 / 5.7 % faster at 16 on the 6.7B and 4.3 / 6.3 % on the 33B, the rest within 0.3 %; so 16 is
# the default since session 41 (profiles measured before then ran 32: `profile_check`).
FP8_GEMV_MAX_M = 16


def set_gemv_max_m(max_m: int) -> None:
    """Set the process's GEMV / _scaled_mm switch (the serving option `fp8_gemv_max_m`, read by
    every `fp8_linear` call from then on: set it before CUDA graphs are captured). 0: every M goes
    to _scaled_mm where it can run."""
    global FP8_GEMV_MAX_M
    if isinstance(max_m, bool) or not isinstance(max_m, int) or max_m < 0:
        raise ValueError(f"fp8_gemv_max_m must be an integer >= 0, got {max_m!r}")
    FP8_GEMV_MAX_M = max_m


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 64
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4
    programs_per_sm: int = 4   # split K until n_tiles * split_k >= programs_per_sm * SMs
    use_dot: bool = True       # False: the FMA kernel (M <= FMA_MAX_M, K % block_k == 0)
    prefetch: bool = False     # FMA kernel, M > 1: load the next K tile before using this one
    # M = 1 (the row kernel): sum each [block_n, block_k] product tile over K at once into a
    # [block_n] accumulator instead of keeping a [block_n, block_k] fp32 one to the end: the
    # registers then do not grow with the tile, so more programs fit on an SM (more weight
    # bytes in flight), at the price of a warp reduction per tile
    row_sum_each: bool = False
    # dot kernel, fp8 weights: the dot in fp16 (E4M3 -> fp16 is one convert per pair) instead
    # of converting the weight to x's dtype (bf16: no direct convert on sm_90)
    dot_f16: bool = False


# FMA kernel (no tensor cores) serves M <= FMA_MAX_M; rows beyond that need the dot kernel.
FMA_MAX_M = 4
# Per-M choice, first entry whose max_m >= M wins; the last entry covers every larger M. Set from
# the H200 sweep in bench/kernels/gpu_check.py (each config checked against the oracle there),
# layer = qkv+o+gate_up+down of the 33B model: M <= 2 FMA 32x256 (M=1: 219.8 us, next best
# 16x512 228.5 us; register prefetch measured slower, 249-341 us); M 4..16 dot 128x128x8 warps
# (261-266 us, 64x128 within 3%).
GEMV_CONFIGS: tuple[tuple[int, GemvConfig], ...] = (
    (2, GemvConfig(block_n=32, block_k=256, num_warps=4, num_stages=3, use_dot=False)),
    (1 << 30, GemvConfig(block_n=128, block_k=128, num_warps=8, num_stages=3)),
)
DEFAULT_GEMV_CONFIG = GEMV_CONFIGS[-1][1]
# Per weight shape (N, K) at M = 1 (one decoding sequence, where FP8 must beat bf16 most), run by
# `_gemv_row_kernel`. From the H200 sweeps of bench/kernels/fp8_gemv_sweep.py (graph replays with the
# L2 cleared). 2026-12-02: thin tiles, one warp, no K split beat the per-M config (layer 218 ->
# 189 us). 2026-12-03 (bench/results/kern_h200_s3/): per-tile row sums (`row_sum_each`: 124 -> 64
# registers for a 2 x 1024 tile) let 1-2 warp programs take 4-8 rows of 1024: qkv 31.3 -> 27.2
# us, o 24.6 -> 23.1, gate_up 83.1 -> 77.1 (84% of copy); down keeps its tile (no power-of-two
# block_k above 256 divides K = 19200; the row-sum variants measured 55-78 us against 49.2).
# Isolated layer 176.6 us (bf16 F.linear 323 us). In the 33B engine (batch-1 graphs, A/B in one
# process): 10.24-10.30 ms/token against 13.9 ms for the old tiles in this kernel.
GEMV_M1_SHAPE_CONFIGS: dict[tuple[int, int], GemvConfig] = {
    (9216, 7168): GemvConfig(block_n=8, block_k=1024, num_warps=2, num_stages=2,
                             programs_per_sm=1, use_dot=False, row_sum_each=True),   # qkv
    (7168, 7168): GemvConfig(block_n=8, block_k=1024, num_warps=2, num_stages=2,
                             programs_per_sm=1, use_dot=False, row_sum_each=True),   # o
    (38400, 7168): GemvConfig(block_n=4, block_k=1024, num_warps=1, num_stages=2,
                              programs_per_sm=1, use_dot=False, row_sum_each=True),  # gate_up
    (7168, 19200): GemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=3,
                              programs_per_sm=4, use_dot=False),    # down (split 2)
    # The 1.3B preset's shapes (issue 32; `fp8_gemv_sweep --preset deepseek-coder-1.3b
    # --weights bf16`, H200, 2026-12-04, bench/results/host_cost_h200_s12/tune): against cuBLAS
    # qkv 13.9 vs 14.8 us, o 8.7 vs 9.9, gate_up 19.7 vs 20.8, down 13.9 vs 15.8, LM head 42.1
    # vs 44.1. Small products are launch-bound (23-54% of copy bandwidth), so the gain comes in
    # the graph, where the next kernel's launch overlaps (PDL): the batch-1 decode graph 1.58 ->
    # 1.22 ms a token, served ITL p50 1.49 -> 1.16 ms.
    (6144, 2048): GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=2,
                             programs_per_sm=1, use_dot=False),     # 1.3B qkv
    (2048, 2048): GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=2,
                             programs_per_sm=1, use_dot=False),     # 1.3B o
    (11008, 2048): GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=2,
                              programs_per_sm=1, use_dot=False),    # 1.3B gate_up
    (2048, 5504): GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=2,
                             programs_per_sm=1, use_dot=False),     # 1.3B down
    (32256, 2048): GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=2,
                              programs_per_sm=1, use_dot=False),    # 1.3B LM head
}


# Our bf16 GEMV (the FMA kernel over bf16 rows, no scale) per 33B shape at M = 1, against
# cuBLAS (F.linear), from `bench/kernels/fp8_gemv_sweep.py --weights bf16` (H200, 2026-12-02, graph
# replays with the L2 cleared): qkv 44.9 vs 48.8 us, o 36.7 vs 39.7, gate_up 136.4 vs 152.2
# (95% of copy bandwidth), down 77.2 vs 81.2 (the fp8 down tiles, split 2): a layer 295 vs 322 us.
# 2026-12-03: qkv with per-tile row sums 44.2 vs 44.7 us; the others stay (row sums, wider tiles
# and the tensor-core kernel measured 1-4% slower there). Shapes not listed stay on cuBLAS.
BF16_GEMV_M1_CONFIGS: dict[tuple[int, int], GemvConfig] = {
    (9216, 7168): GemvConfig(block_n=8, block_k=512, num_warps=2, num_stages=2,
                             programs_per_sm=1, use_dot=False, row_sum_each=True),   # qkv
    (7168, 7168): GemvConfig(block_n=8, block_k=512, num_warps=2, num_stages=3,
                             programs_per_sm=1, use_dot=False),     # o
    (38400, 7168): GemvConfig(block_n=8, block_k=512, num_warps=2, num_stages=3,
                              programs_per_sm=1, use_dot=False),    # gate_up
    (7168, 19200): GemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=3,
                              programs_per_sm=4, use_dot=False),    # down (split 2)
}


# The down projection with silu*mul fused in (`gemv_silu_mul_triton`), one row, per weight kind
# and shape. Before an H200 measurement these are the plain down tiles (split 2).
SILU_DOWN_M1_CONFIGS: dict[str, dict[tuple[int, int], GemvConfig]] = {
    "fp8": {(7168, 19200): GEMV_M1_SHAPE_CONFIGS[7168, 19200]},
    "bf16": {(7168, 19200): BF16_GEMV_M1_CONFIGS[7168, 19200]},
}
# 1.3B (same sweep): 14.6 us with a 3-way K split (its reduce launch included) against 19.8 for
# silu_and_mul + the down GEMV; held to one split (no reduce) the served ITL was worse, 1.28 vs
# 1.13 ms (bench/results/host_cost_h200_s12/tune2)
SILU_DOWN_M1_CONFIGS["bf16"][2048, 5504] = GemvConfig(
    block_n=8, block_k=512, num_warps=2, num_stages=2, programs_per_sm=4, use_dot=False)


# The qkv and gate_up projections with the RMSNorm before them folded in
# (`gemv_rms_norm_triton`, TIDEGATE_FUSED_NORM_GEMV=1), one row, per weight kind and shape.
# Before an H200 measurement these are the plain one-row tiles of each table.
NORM_GEMV_M1_CONFIGS: dict[str, dict[tuple[int, int], GemvConfig]] = {
    "fp8": {shape: GEMV_M1_SHAPE_CONFIGS[shape] for shape in ((9216, 7168), (38400, 7168))},
    "bf16": {shape: BF16_GEMV_M1_CONFIGS[shape] for shape in ((9216, 7168), (38400, 7168))},
}


def config_tables() -> dict:
    """The per-shape M = 1 tables (copies), in the form `set_config_tables` and
    `tables_from_json` use: {"fp8" | "bf16" | "silu_down_fp8" | "silu_down_bf16" |
    "norm_fp8" | "norm_bf16": {(N, K): GemvConfig}}."""
    return {"fp8": dict(GEMV_M1_SHAPE_CONFIGS), "bf16": dict(BF16_GEMV_M1_CONFIGS),
            "silu_down_fp8": dict(SILU_DOWN_M1_CONFIGS["fp8"]),
            "silu_down_bf16": dict(SILU_DOWN_M1_CONFIGS["bf16"]),
            "norm_fp8": dict(NORM_GEMV_M1_CONFIGS["fp8"]),
            "norm_bf16": dict(NORM_GEMV_M1_CONFIGS["bf16"])}


def set_config_tables(tables: dict, replace: bool = False) -> None:
    """Replace entries of the M = 1 tables in place (the dispatchers read them at call time, so
    a graph captured afterwards uses them): for A/B runs of swept configs. `replace`: each
    table becomes exactly `tables`' (shapes missing there leave it: back to cuBLAS / defaults)."""
    for name, table in (("fp8", GEMV_M1_SHAPE_CONFIGS), ("bf16", BF16_GEMV_M1_CONFIGS),
                        ("silu_down_fp8", SILU_DOWN_M1_CONFIGS["fp8"]),
                        ("silu_down_bf16", SILU_DOWN_M1_CONFIGS["bf16"]),
                        ("norm_fp8", NORM_GEMV_M1_CONFIGS["fp8"]),
                        ("norm_bf16", NORM_GEMV_M1_CONFIGS["bf16"])):
        if replace:
            table.clear()
        table.update(tables.get(name, {}))


def load_config_file(path: str) -> int:
    """Add the configs of a swept JSON (`bench/kernels/fp8_gemv_sweep.py --tuned-out`) to the
    tables; returns how many. Read at start-up from TIDEGATE_GEMV_CONFIGS (a path): a model
    whose shapes the committed tables lack (they hold the 33B's) gets its measured configs
    without a code change, before `install_gemv` picks the layers to swap."""
    import json

    with open(path) as f:
        tables = tables_from_json(json.load(f))
    set_config_tables(tables)
    return sum(len(t) for t in tables.values())


def tables_from_json(doc: dict) -> dict:
    """{"fp8": {"9216x7168": {GemvConfig fields}}, ...} (bench/kernels/fp8_gemv_sweep.py --tuned-out)
    -> the form of `config_tables`."""
    return {name: {tuple(int(v) for v in shape.split("x")): GemvConfig(**cfg)
                   for shape, cfg in table.items()} for name, table in doc.items()}


def bf16_gemv(x: torch.Tensor, w: torch.Tensor, config: GemvConfig) -> torch.Tensor:
    """x [1, K] @ w [N, K].T -> [1, N] (model-dtype weights) through the FMA GEMV kernel."""
    return fp8_gemv_triton(x if x.stride(-1) == 1 else x.contiguous(), w, None, config)


def gemv_config_for(m: int, n: int | None = None, k: int | None = None) -> GemvConfig:
    if m == 1 and (n, k) in GEMV_M1_SHAPE_CONFIGS:
        return GEMV_M1_SHAPE_CONFIGS[n, k]
    for max_m, config in GEMV_CONFIGS:
        if m <= max_m:
            return config
    return DEFAULT_GEMV_CONFIG


# ---- quantization ------------------------------------------------------------------------------

def quantize_fp8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (w_fp8 [N, K] e4m3, scale fp32 [N]) with scale = amax(|w[n]|) / 448."""
    amax = w.abs().amax(dim=1).to(torch.float32).clamp(min=1e-12)
    scale = amax / FP8_MAX
    w_fp8 = (w.to(torch.float32) / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return w_fp8.contiguous(), scale.contiguous()


def dequantize_fp8_per_channel(w_fp8: torch.Tensor, scale: torch.Tensor,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (w_fp8.to(torch.float32) * scale[:, None].to(torch.float32)).to(dtype)


def quantize_fp8_per_token_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_fp8 [M, K], x_scale fp32 [M, 1]) with x_scale = amax(|x[m]|) / 448."""
    amax = x.abs().amax(dim=1, keepdim=True).to(torch.float32).clamp(min=1e-12)
    x_scale = amax / FP8_MAX
    x_fp8 = (x.to(torch.float32) / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x_fp8, x_scale


def check_fp8_support(device: torch.device | str) -> None:
    """Raise a clear error where E4M3 weights cannot run (needs CUDA compute capability >= 8.9)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise RuntimeError(f"fp8 quantization needs a CUDA GPU (compute capability >= 8.9); "
                           f"device is {device}")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise RuntimeError(f"fp8 quantization needs compute capability >= 8.9 (Ada/Hopper); "
                           f"{torch.cuda.get_device_name(device)} is {major}.{minor}")


# ---- references --------------------------------------------------------------------------------

def fp8_gemv_reference(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Weight-only oracle: x @ (w_fp8 * scale).T in fp32 (float64 for float64 x) -> x.dtype."""
    acc_dtype = torch.promote_types(x.dtype, torch.float32)
    y = (x.to(acc_dtype) @ w_fp8.to(acc_dtype).T) * scale.to(acc_dtype)
    return y.to(x.dtype)


def fp8_scaled_mm_reference(x: torch.Tensor, w_fp8: torch.Tensor,
                            scale: torch.Tensor) -> torch.Tensor:
    """W8A8 oracle of the _scaled_mm path: x quantized per token, then both dequantized."""
    x_fp8, x_scale = quantize_fp8_per_token_reference(x)
    x_deq = x_fp8.to(torch.float32) * x_scale
    return fp8_gemv_reference(x_deq, w_fp8, scale).to(x.dtype)


# ---- Triton kernels ----------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit
    def _fp8_gemv_kernel(
        x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, k_per_split,
        stride_xm, stride_wn, stride_om,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr, PARTIALS: tl.constexpr, USE_PDL: tl.constexpr,
        HAS_SCALE: tl.constexpr = True, DOT_F16: tl.constexpr = False,
    ):
        """Tensor-core path: acc[BLOCK_N, BLOCK_M] += w[BLOCK_N, BLOCK_K] @ x^T[BLOCK_K, BLOCK_M].

        DOT_F16 (fp8 weights, bf16 x): the dot runs in fp16, fp32 accumulation. E4M3 -> fp16 is
        one convert per pair and exact (there is no direct E4M3 -> bf16 convert on sm_90), and
        bf16 -> fp16 is exact inside fp16's normal range; x is clamped to +-65504 so an outlier
        saturates instead of becoming inf."""
        pdl_enter(USE_PDL)
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_n = offs_n < N
        mask_m = offs_m < M
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)

        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn          # [BLOCK_N, 1]
        x_cols = x_ptr + offs_m.to(tl.int64)[None, :] * stride_xm          # [1, BLOCK_M]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None], other=0.0)
                xt = tl.load(x_cols + offs_k[:, None], mask=mask_m[None, :], other=0.0)
            else:
                mask_k = offs_k < k_end
                w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                            other=0.0)
                xt = tl.load(x_cols + offs_k[:, None], mask=mask_m[None, :] & mask_k[:, None],
                             other=0.0)
            if DOT_F16:
                acc += tl.dot(w.to(tl.float16), _to_f16(xt))
            else:
                acc += tl.dot(w.to(xt.dtype), xt)

        if HAS_SCALE:
            s = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)
            acc = acc * s[:, None]
        mask = mask_n[:, None] & mask_m[None, :]
        if PARTIALS:  # out_ptr: fp32 partials [split_k, M, N]
            part = out_ptr + pid_k.to(tl.int64) * M * N
            tl.store(part + offs_m[None, :] * N + offs_n[:, None], acc, mask=mask)
        else:
            tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None],
                     acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _to_f16(x):
        return tl.minimum(tl.maximum(x.to(tl.float32), -65504.0), 65504.0).to(tl.float16)

    @triton.jit
    def _fp8_gemv_fma_kernel(
        x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, k_per_split,
        stride_xm, stride_wn, stride_om,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PARTIALS: tl.constexpr, PREFETCH: tl.constexpr, USE_PDL: tl.constexpr,
        HAS_SCALE: tl.constexpr = True,
    ):
        """CUDA-core path for 2 <= M <= 4 (K % BLOCK_K == 0, k_per_split a multiple of
        BLOCK_K; one row goes to `_gemv_row_kernel`): each K tile is converted once and reduced
        per row into acc[BLOCK_N, BLOCK_M]. PREFETCH keeps the next tile's load in flight while
        this one is used (the last iteration re-reads its own tile instead of running past the
        split)."""
        pdl_enter(USE_PDL)
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_kb = tl.arange(0, BLOCK_K)
        mask_n = offs_n < N
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn

        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        if PREFETCH:
            w_next = tl.load(w_rows + (k_start + offs_kb)[None, :], mask=mask_n[:, None],
                             other=0.0)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + offs_kb
            if PREFETCH:
                w = w_next
                k_nxt = tl.minimum(k0 + BLOCK_K, k_end - BLOCK_K)
                w_next = tl.load(w_rows + (k_nxt + offs_kb)[None, :], mask=mask_n[:, None],
                                 other=0.0)
            else:
                w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None], other=0.0)
            wf = w.to(tl.float32)
            for mm in tl.static_range(BLOCK_M):
                row = tl.minimum(mm, M - 1)   # rows >= M compute garbage that is not stored
                xr = tl.load(x_ptr + row * stride_xm + offs_k).to(tl.float32)
                part = tl.sum(wf * xr[None, :], axis=1)                       # [BLOCK_N]
                acc = tl.where(offs_m[None, :] == mm, acc + part[:, None], acc)

        if HAS_SCALE:
            s = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)
            acc = acc * s[:, None]
        mask = mask_n[:, None] & (offs_m < M)[None, :]
        if PARTIALS:
            part_ptr = out_ptr + pid_k.to(tl.int64) * M * N
            tl.store(part_ptr + offs_m[None, :] * N + offs_n[:, None], acc, mask=mask)
        else:
            tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None],
                     acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _row_activation(x_ptr, offs_k, K, mask, MASKED: tl.constexpr, GATED: tl.constexpr,
                        r_ptr, nw_ptr, rstd, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
        """fp32 [BLOCK_K] activation tile: x[offs_k], or with GATED (x = [gate | up], 2K wide)
        silu(gate) * up rounded once to x's dtype, the numbers `silu_mul` would have stored, or
        with NORM the RMSNorm output `rmsnorm` would have stored: h = x (+ r[offs_k], rounded to
        x's dtype with HAS_RESIDUAL), then (h * rstd) rounded, times nw[offs_k], rounded again.
        MASKED: columns where `mask` is False read 0 (else `mask` is not used)."""
        if MASKED:
            if GATED:
                g = tl.load(x_ptr + offs_k, mask=mask, other=0.0).to(tl.float32)
                u = tl.load(x_ptr + K + offs_k, mask=mask, other=0.0).to(tl.float32)
            else:
                a = tl.load(x_ptr + offs_k, mask=mask, other=0.0)
            if NORM:
                nw = tl.load(nw_ptr + offs_k, mask=mask, other=0.0)
                if HAS_RESIDUAL:
                    r = tl.load(r_ptr + offs_k, mask=mask, other=0.0)
        else:
            if GATED:
                g = tl.load(x_ptr + offs_k).to(tl.float32)
                u = tl.load(x_ptr + K + offs_k).to(tl.float32)
            else:
                a = tl.load(x_ptr + offs_k)
            if NORM:
                nw = tl.load(nw_ptr + offs_k)
                if HAS_RESIDUAL:
                    r = tl.load(r_ptr + offs_k)
        if GATED:
            a = (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty)
        elif NORM:
            if HAS_RESIDUAL:
                a = (a.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
            a = (a.to(tl.float32) * rstd).to(x_ptr.dtype.element_ty)
            a = (a.to(tl.float32) * nw.to(tl.float32)).to(x_ptr.dtype.element_ty)
        return a.to(tl.float32)

    @triton.jit
    def _norm_prologue(x_ptr, r_ptr, new_r_ptr, K, eps, writer, BLOCK_K: tl.constexpr,
                       HAS_RESIDUAL: tl.constexpr, UNROLL: tl.constexpr):
        """1 / rms of h = x (+ r, rounded to x's dtype) over all K columns (as `rmsnorm`
        computes it). With HAS_RESIDUAL the `writer` program then stores h to new_r (the new
        residual stream) in a second pass: a store inside the sum loop would keep the compiler
        from issuing the next tiles' loads early (it may alias them)."""
        offs_kb = tl.arange(0, BLOCK_K)
        ss = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, loop_unroll_factor=UNROLL):
            offs = k0 + offs_kb
            mask = offs < K
            h = tl.load(x_ptr + offs, mask=mask, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(r_ptr + offs, mask=mask, other=0.0)
                h = (h.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
            hf = h.to(tl.float32)
            ss += hf * hf
        if HAS_RESIDUAL:  # noqa: SIM102 (a compile-time branch, then a run-time one)
            if writer:
                for k0 in range(0, K, BLOCK_K):
                    offs = k0 + offs_kb
                    mask = offs < K
                    h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                    h += tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                    tl.store(new_r_ptr + offs, h.to(x_ptr.dtype.element_ty), mask=mask)
        return 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)

    @triton.jit
    def _gemv_row_kernel(
        x_ptr, w_ptr, scale_ptr, out_ptr, N, K, k_per_split, stride_wn,
        r_ptr, nw_ptr, new_r_ptr, eps,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROW_SUM_EACH: tl.constexpr,
        GATED: tl.constexpr, PARTIALS: tl.constexpr, HAS_SCALE: tl.constexpr,
        USE_PDL: tl.constexpr, EVEN_K: tl.constexpr = True, NORM: tl.constexpr = False,
        HAS_RESIDUAL: tl.constexpr = False, NORM_UNROLL: tl.constexpr = 1,
    ):
        """One row (M = 1) on CUDA cores: out[n] = sum_k w[n, k] a[k] (* scale[n]).

        a = x, or with GATED silu(x[:K]) * x[K:] (`_row_activation`): the down projection then
        reads the gate_up output itself and the silu*mul launch and its [1, K] round trip go;
        or with NORM the RMSNorm (HAS_RESIDUAL: add + RMSNorm) of x with weight nw: every
        program first sums h^2 over all of K (`_norm_prologue`; x and r are small and sit in
        L2), program (0, 0) writes the new residual h, then the stream applies the norm per
        tile, rounded as `rmsnorm` stores it: the norm launch and its [1, K] round trip go.
        NORM_UNROLL: the prologue loop's unroll factor.
        k_per_split is a multiple of BLOCK_K; EVEN_K (K % BLOCK_K == 0) leaves every load
        unmasked in K, else the first and the last tile of a split are masked (K = 19200 takes
        no power-of-two tile above 256 evenly). The first weight tile is loaded before
        `pdl_enter`: weights are constant, so their stream starts in the previous kernel's tail
        (only the activation waits for it).
        """
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_kb = tl.arange(0, BLOCK_K)
        mask_n = offs_n < N
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
        if EVEN_K:
            k_full = k_end
            mask_k0 = offs_kb < BLOCK_K   # (not used)
            w = tl.load(w_rows + (k_start + offs_kb)[None, :], mask=mask_n[:, None], other=0.0)
        else:
            k_full = k_start + (k_end - k_start) // BLOCK_K * BLOCK_K   # end of whole tiles
            mask_k0 = k_start + offs_kb < k_end
            w = tl.load(w_rows + (k_start + offs_kb)[None, :],
                        mask=mask_n[:, None] & mask_k0[None, :], other=0.0)
        pdl_enter(USE_PDL)
        if NORM:
            rstd = _norm_prologue(x_ptr, r_ptr, new_r_ptr, K, eps, (pid_n == 0) & (pid_k == 0),
                                  BLOCK_K, HAS_RESIDUAL, NORM_UNROLL)
        else:
            rstd = 1.0

        prod = w.to(tl.float32) * _row_activation(x_ptr, k_start + offs_kb, K, mask_k0,
                                                  not EVEN_K, GATED, r_ptr, nw_ptr, rstd, NORM,
                                                  HAS_RESIDUAL)[None, :]
        if ROW_SUM_EACH:
            acc = tl.sum(prod, axis=1)
        else:
            acc2 = prod
        for k0 in range(k_start + BLOCK_K, k_full, BLOCK_K):
            offs_k = k0 + offs_kb
            w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None], other=0.0)
            prod = w.to(tl.float32) * _row_activation(x_ptr, offs_k, K, mask_k0, False,
                                                      GATED, r_ptr, nw_ptr, rstd, NORM,
                                                      HAS_RESIDUAL)[None, :]
            if ROW_SUM_EACH:
                acc += tl.sum(prod, axis=1)
            else:
                acc2 += prod
        if not EVEN_K:
            k_tail = tl.maximum(k_full, k_start + BLOCK_K)
            if k_tail < k_end:  # a partial last tile after at least one whole one
                offs_k = k_tail + offs_kb
                mask_k = offs_k < k_end
                w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                            other=0.0)
                prod = w.to(tl.float32) * _row_activation(x_ptr, offs_k, K, mask_k, True,
                                                          GATED, r_ptr, nw_ptr, rstd, NORM,
                                                          HAS_RESIDUAL)[None, :]
                if ROW_SUM_EACH:
                    acc += tl.sum(prod, axis=1)
                else:
                    acc2 += prod
        if not ROW_SUM_EACH:
            acc = tl.sum(acc2, axis=1)

        if HAS_SCALE:
            acc = acc * tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)
        if PARTIALS:
            tl.store(out_ptr + pid_k.to(tl.int64) * N + offs_n, acc, mask=mask_n)
        else:
            tl.store(out_ptr + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)

    @triton.jit
    def _splitk_reduce_kernel(part_ptr, out_ptr, M, N, split_k, stride_om,
                              BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        pdl_enter(USE_PDL)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < M * N
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in range(split_k):
            acc += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0)
        m = offs // N
        n = offs % N
        tl.store(out_ptr + m * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _quant_per_token_kernel(x_ptr, out_ptr, scale_ptr, K, stride_x, stride_o,
                                FP8_MAX: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        pdl_enter(USE_PDL)
        row = tl.program_id(0).to(tl.int64)
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / FP8_MAX
        tl.store(scale_ptr + row, scale)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0)
            q = tl.minimum(tl.maximum(x.to(tl.float32) / scale, -FP8_MAX), FP8_MAX)
            tl.store(out_ptr + row * stride_o + offs, q.to(out_ptr.dtype.element_ty),
                     mask=offs < K)


def split_k_for(n: int, k: int, config: GemvConfig, sm_count: int) -> tuple[int, int]:
    """(split_k, k_per_split): enough programs to fill the chip, each split a multiple of
    block_k."""
    n_tiles = cdiv(n, config.block_n)
    k_blocks = cdiv(k, config.block_k)
    wanted = cdiv(config.programs_per_sm * sm_count, n_tiles)
    split = max(1, min(wanted, k_blocks))
    k_per_split = cdiv(k_blocks, split) * config.block_k
    return cdiv(k, k_per_split), k_per_split


def fp8_gemv_triton(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor | None,
                    config: GemvConfig | None = None) -> torch.Tensor:
    """x [M, K] (contiguous rows) @ fp8 weight -> [M, N] in x's dtype. The kernels convert
    whatever the weight's dtype is to fp32, so `scale=None` with bf16 rows is a plain bf16 GEMV
    (`bf16_gemv`)."""
    m, k = x.shape
    n = w_fp8.shape[0]
    config = config or gemv_config_for(m, n, k)
    if not config.use_dot and (m > FMA_MAX_M or (m > 1 and k % config.block_k)):
        config = DEFAULT_GEMV_CONFIG          # the FMA kernel's preconditions do not hold
    assert w_fp8.shape[1] == k and w_fp8.stride(1) == 1 and x.stride(1) == 1
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    split_k, k_per_split = split_k_for(n, k, config, num_sms(x.device))
    partials = split_k > 1
    target = (torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
              if partials else out)
    if config.use_dot:
        block_m = min(64, max(16, next_power_of_2(m)))
        _fp8_gemv_kernel[(cdiv(n, config.block_n), split_k, cdiv(m, block_m))](
            x, w_fp8, w_fp8 if scale is None else scale, target, m, n, k, k_per_split,
            x.stride(0), w_fp8.stride(0), out.stride(0),
            BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            EVEN_K=k % config.block_k == 0, PARTIALS=partials, HAS_SCALE=scale is not None,
            DOT_F16=config.dot_f16 and w_fp8.dtype == FP8_DTYPE,
            num_warps=config.num_warps, num_stages=config.num_stages, **pdl_args(x),
        )
    elif m == 1:
        _gemv_row_kernel[(cdiv(n, config.block_n), split_k)](
            x, w_fp8, w_fp8 if scale is None else scale, target, n, k, k_per_split,
            w_fp8.stride(0), x, x, x, 0.0, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            ROW_SUM_EACH=config.row_sum_each, GATED=False, PARTIALS=partials,
            HAS_SCALE=scale is not None, EVEN_K=k % config.block_k == 0,
            num_warps=config.num_warps,
            num_stages=config.num_stages, **pdl_args(x),
        )
    else:
        _fp8_gemv_fma_kernel[(cdiv(n, config.block_n), split_k)](
            x, w_fp8, w_fp8 if scale is None else scale, target, m, n, k, k_per_split,
            x.stride(0), w_fp8.stride(0), out.stride(0),
            BLOCK_M=next_power_of_2(m), BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            PARTIALS=partials, PREFETCH=config.prefetch, HAS_SCALE=scale is not None,
            num_warps=config.num_warps, num_stages=config.num_stages, **pdl_args(x),
        )
    if partials:
        block = 1024
        _splitk_reduce_kernel[(cdiv(m * n, block),)](
            target, out, m, n, split_k, out.stride(0), BLOCK=block, num_warps=4, **pdl_args(x),
        )
    return out


def gemv_silu_mul_triton(gate_up: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
                         config: GemvConfig) -> torch.Tensor:
    """silu(gate_up[:, :K]) * gate_up[:, K:] @ w [N, K].T (* scale) -> [1, N] in one kernel
    (plus the split-K reduce when the config splits K): the down projection of a one-row step
    with the activation fused in. w is fp8 with per-channel `scale`, or model-dtype rows with
    `scale=None`; config must be an FMA config."""
    n, k = w.shape
    assert gate_up.shape == (1, 2 * k) and gate_up.stride(1) == 1 and w.stride(1) == 1
    assert not config.use_dot, config
    out = torch.empty((1, n), dtype=gate_up.dtype, device=gate_up.device)
    split_k, k_per_split = split_k_for(n, k, config, num_sms(gate_up.device))
    partials = split_k > 1
    target = (torch.empty((split_k, 1, n), dtype=torch.float32, device=gate_up.device)
              if partials else out)
    _gemv_row_kernel[(cdiv(n, config.block_n), split_k)](
        gate_up, w, w if scale is None else scale, target, n, k, k_per_split, w.stride(0),
        gate_up, gate_up, gate_up, 0.0, BLOCK_N=config.block_n, BLOCK_K=config.block_k, ROW_SUM_EACH=config.row_sum_each,
        GATED=True, PARTIALS=partials, HAS_SCALE=scale is not None,
        EVEN_K=k % config.block_k == 0, num_warps=config.num_warps, num_stages=config.num_stages, **pdl_args(gate_up),
    )
    if partials:
        _splitk_reduce_kernel[(cdiv(n, 1024),)](
            target, out, 1, n, split_k, out.stride(0), BLOCK=1024, num_warps=4,
            **pdl_args(gate_up),
        )
    return out


def gemv_silu_mul_reference(gate_up: torch.Tensor, w: torch.Tensor,
                            scale: torch.Tensor | None) -> torch.Tensor:
    """The unfused numbers: silu_and_mul's activation rounded to gate_up's dtype, then the
    weight-only oracle in float64 (returned in float64)."""
    k = w.shape[1]
    acc_dtype = torch.promote_types(gate_up.dtype, torch.float32)
    g, u = gate_up[:, :k].to(acc_dtype), gate_up[:, k:].to(acc_dtype)
    act = (torch.nn.functional.silu(g) * u).to(gate_up.dtype)
    if scale is None:
        scale = torch.ones(w.shape[0], dtype=torch.float32, device=w.device)
    return fp8_gemv_reference(act.double(), w, scale)


# The fused-norm prologue's sum loop unrolled by 2: an offline sm_90 compile (Triton 3.9,
# the JIT's divisibility hints) issues both tiles' x and residual loads before their first use,
# so a program waits on half the serial L2 round trips (4 instead of 7 for K = 7168 in 1024
# tiles) at the same register count (fp8 qkv tile 96, gate_up 128, bf16 qkv 72); unrolled by
# 4 it needs 145 / 188 / 84 registers (fewer programs resident).
NORM_PROLOGUE_UNROLL = 2


def gemv_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor | None,
                         norm_weight: torch.Tensor, eps: float, w: torch.Tensor,
                         scale: torch.Tensor | None,
                         config: GemvConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h) @ w [N, K].T (* scale) -> [1, N], h) with h = x + residual (or x where
    residual is None) in one kernel (plus the split-K reduce when the config splits K): the
    projection after a decoder layer's norm (qkv, gate_up) with the norm folded into its
    prologue, for one row. The activation is rounded as `fused_add_rms_norm` stores it, so
    the numbers are the pair's. h is a new [1, K] tensor written by one program (x itself
    where there is no residual). w is fp8 with per-channel `scale`, or model-dtype rows with
    `scale=None`; config must be an FMA config."""
    n, k = w.shape
    assert x.shape == (1, k) and x.stride(1) == 1 and w.stride(1) == 1, (x.shape, w.shape)
    assert norm_weight.shape == (k,) and norm_weight.stride(0) == 1
    assert not config.use_dot, config
    if residual is not None:
        assert residual.shape == (1, k) and residual.stride(1) == 1
        new_residual = torch.empty((1, k), dtype=x.dtype, device=x.device)
    else:
        new_residual = x
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    split_k, k_per_split = split_k_for(n, k, config, num_sms(x.device))
    partials = split_k > 1
    target = (torch.empty((split_k, 1, n), dtype=torch.float32, device=x.device)
              if partials else out)
    r = residual if residual is not None else x
    _gemv_row_kernel[(cdiv(n, config.block_n), split_k)](
        x, w, w if scale is None else scale, target, n, k, k_per_split, w.stride(0),
        r, norm_weight, new_residual, float(eps),
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, ROW_SUM_EACH=config.row_sum_each,
        GATED=False, PARTIALS=partials, HAS_SCALE=scale is not None,
        EVEN_K=k % config.block_k == 0, NORM=True, HAS_RESIDUAL=residual is not None,
        NORM_UNROLL=NORM_PROLOGUE_UNROLL,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl_args(x),
    )
    if partials:
        _splitk_reduce_kernel[(cdiv(n, 1024),)](
            target, out, 1, n, split_k, out.stride(0), BLOCK=1024, num_warps=4, **pdl_args(x),
        )
    return out, new_residual


def gemv_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor | None,
                            norm_weight: torch.Tensor, eps: float, w: torch.Tensor,
                            scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused numbers: (add +) RMSNorm as `rmsnorm`'s reference rounds it, then the
    weight-only oracle in float64 (returned in float64), and the new residual."""
    if residual is None:
        normed, new_residual = rms_norm_reference(x, norm_weight, eps), x
    else:
        normed, new_residual = fused_add_rms_norm_reference(x, residual, norm_weight, eps)
    if scale is None:
        scale = torch.ones(w.shape[0], dtype=torch.float32, device=w.device)
    return fp8_gemv_reference(normed.double(), w, scale), new_residual


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (row) E4M3 quantization of activations x [M, K] -> (x_fp8, x_scale [M, 1])."""
    if not use_triton(x):
        return quantize_fp8_per_token_reference(x)
    m, k = x.shape
    out = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    x_scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        _quant_per_token_kernel[(m,)](x, out, x_scale, k, x.stride(0), out.stride(0),
                                      FP8_MAX=FP8_MAX, BLOCK=2048, num_warps=8, **pdl_args(x))
    return out, x_scale


def fp8_scaled_mm(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """W8A8 through torch._scaled_mm with row-wise scales (per-token x, per-channel w)."""
    x_fp8, x_scale = quantize_fp8_per_token(x)
    return torch._scaled_mm(x_fp8, w_fp8.t(), scale_a=x_scale, scale_b=scale.view(1, -1),
                            out_dtype=x.dtype)


def _scaled_mm_ok(x: torch.Tensor, w_fp8: torch.Tensor) -> bool:
    n, k = w_fp8.shape
    return x.is_cuda and x.dtype == torch.bfloat16 and k % 16 == 0 and n % 16 == 0


def fp8_gemv(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Weight-only fp8 GEMV (any M) -> [M, N]: Triton on CUDA, the torch oracle elsewhere."""
    if use_triton(x):
        return fp8_gemv_triton(x if x.stride(-1) == 1 else x.contiguous(), w_fp8, scale)
    return fp8_gemv_reference(x, w_fp8, scale)


def fp8_linear(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """y [..., N] = x [..., K] @ (w_fp8 * scale).T.

    M <= FP8_GEMV_MAX_M (or no _scaled_mm for these shapes/dtype): weight-only Triton GEMV;
    larger M: per-token fp8 x and torch._scaled_mm (W8A8). CPU: the weight-only oracle.
    """
    n, k = w_fp8.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if not use_triton(x2):
        y = fp8_gemv_reference(x2, w_fp8, scale)
    elif x2.shape[0] <= FP8_GEMV_MAX_M or not _scaled_mm_ok(x2, w_fp8):
        y = fp8_gemv_triton(x2, w_fp8, scale)
    else:
        y = fp8_scaled_mm(x2, w_fp8, scale)
    return y.view(*x.shape[:-1], n)
