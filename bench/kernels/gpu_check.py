"""Check and time the Triton kernels on the GPU in one run (issue 7, sections 1 and 3).

    PYTHONUNBUFFERED=1 python3 -m bench.kernels.gpu_check --out $OUT 2>&1 | tee $OUT/log.txt

1. `pytest -m gpu tests/test_kernels_gpu.py` (output in OUT/pytest.txt)
2. the two ceilings measured here: device-to-device copy bandwidth, bf16 matmul TFLOP/s
3. paged attention (backend.kernels.paged_attention), 33B heads (56 q / 8 kv / 128), block 16:
   decode time per KV format (bf16 / fp8 / int4-fp8) at batch 1/8/64 x context 2k/8k/16k
   (KV bytes read / time vs the copy bandwidth), a warps sweep, and mixed steps (decodes
   plus a prefill chunk in one launch)
4. fp8 weight-only GEMV vs F.linear (bf16) vs torch._scaled_mm (row-wise) for the 33B projection
   shapes at M = 1..64: achieved TB/s on the weight bytes, and the measured crossover M
5. rmsnorm / silu_mul / rotary_kv at decode and prefill sizes (GB/s)

Writes OUT/kernels.json after every section (so a timeout still leaves numbers) and prints a
short table at the end. `--dry-run` runs the plumbing on the CPU at toy sizes (no timings that
mean anything) to check the script itself.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from backend.kernels import fp8_gemv as fp8
from backend.kernels import paged_attention as attn
from backend.kernels.rmsnorm import fused_add_rms_norm
from backend.kernels.rotary_kv import build_rope_cache, rotary_kv_write
from backend.kernels.silu_mul import silu_and_mul
from backend.kv.formats import QuantizedPages

# 33B (deepseek-coder-33b) shapes
HIDDEN, INTER, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 7168, 19200, 56, 8, 128
PROJ_SHAPES = {  # name: (N out, K in)
    "qkv": ((NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, HIDDEN),
    "o": (HIDDEN, NUM_HEADS * HEAD_DIM),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
}
GEMV_MS = [1, 2, 4, 8, 16, 32, 64]
ATTN_BATCHES = [1, 8, 32, 64]
CONTEXT = 2048
BLOCK_SIZE = 16


class Runner:
    def __init__(self, out_dir: Path, dry_run: bool, budget_s: float):
        self.out_dir = out_dir
        self.dry_run = dry_run
        self.device = "cpu" if dry_run else "cuda"
        self.t0 = time.time()
        self.budget_s = budget_s
        self.results: dict = {"meta": {}, "ceilings": {}, "tests": {}, "attention": [],
                              "attention_sweep": [], "attention_dots": [], "attention_splits": [], "sdpa": [],
                              "gemv": [], "gemv_sweep": [],
                              "small_kernels": [], "summary": {}}

    def elapsed(self) -> float:
        return time.time() - self.t0

    def time_left(self) -> float:
        return self.budget_s - self.elapsed()

    def save(self) -> None:
        (self.out_dir / "kernels.json").write_text(json.dumps(self.results, indent=1))

    def bench_ms(self, fn, rep_ms: int = 40, graph: bool = True) -> float:
        """Median GPU ms of fn, timed as CUDA-graph replays so Python launch overhead stays out
        (decode runs under graphs too); triton's do_bench clears the L2 before every replay."""
        if self.dry_run:
            fn()
            times = []
            for _ in range(3):
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
            return statistics.median(times)
        import triton.testing
        fn()
        torch.cuda.synchronize()
        if not graph:
            return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms,
                                                 return_mode="median"))
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            torch.cuda.synchronize()
            target = graph.replay
        except RuntimeError as exc:  # not capturable: time the eager calls instead
            log(f"graph capture failed ({exc!r:.120}); timing eagerly")
            torch.cuda.synchronize()
            target = fn
        return float(triton.testing.do_bench(target, warmup=10, rep=rep_ms,
                                             return_mode="median"))

    def randn(self, *shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, device=self.device) * scale).to(dtype)


def log(msg: str) -> None:
    print(msg, flush=True)


# ---- 1. tests ---------------------------------------------------------------------------------

def run_tests(r: Runner, paths: list[str]) -> None:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *paths]
    log("$ " + " ".join(cmd))
    t = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    text = proc.stdout + proc.stderr
    (r.out_dir / "pytest.txt").write_text(text)
    tail = [line for line in text.strip().splitlines() if line.strip()][-25:]
    log("\n".join(tail))
    r.results["tests"] = {"command": " ".join(cmd[1:]), "returncode": proc.returncode,
                          "summary": tail[-1] if tail else "", "seconds": round(time.time() - t, 1)}
    r.save()


# ---- 2. ceilings ------------------------------------------------------------------------------

def measure_ceilings(r: Runner) -> None:
    n_bytes = (1 << 20) if r.dry_run else (2 << 30)
    src = torch.randn(n_bytes // 4, device=r.device)
    dst = torch.empty_like(src)
    # eager: a captured device-to-device memcpy ran on the copy engines at 2.77 TB/s (H200,
    # 2026-12-02) against 4.25 TB/s for the same copy launched eagerly on the SMs
    ms = r.bench_ms(partial(dst.copy_, src), rep_ms=200, graph=False)
    copy_tbs = 2 * n_bytes / ms / 1e9
    size = 256 if r.dry_run else 8192
    a, b = r.randn(size, size), r.randn(size, size)
    ms_mm = r.bench_ms(partial(torch.matmul, a, b), rep_ms=300)
    tflops = 2 * size**3 / ms_mm / 1e9
    r.results["ceilings"] = {"copy_tb_s": copy_tbs, "copy_bytes": 2 * n_bytes,
                             "bf16_matmul_tflop_s": tflops, "matmul_size": size}
    log(f"ceilings: copy {copy_tbs:.2f} TB/s (read+write), bf16 matmul {tflops:.0f} TFLOP/s")
    r.save()


# ---- 3. paged attention ------------------------------------------------------------------------

ATTN_FORMATS = {"bf16": None, "fp8": ("fp8", "fp8"), "int4-fp8": ("int4", "fp8"),
                # int4-fp8 as served: each decode's block being filled read from its fill rows
                "int4-fp8+fill": ("int4", "fp8")}
ATTN_DECODE_BATCHES = [1, 8, 64]
ATTN_CONTEXTS = [2048, 8192, 16384]
# mixed steps: (decodes, their context, prefill chunk tokens, the chunk's cached prefix)
ATTN_MIXED = [(64, 2048, 512, 0), (64, 2048, 512, 2048), (16, 8192, 256, 0), (0, 0, 2048, 0)]


def _pools(r: Runner, fmt: str, num_blocks: int, heads_kv: int, head_dim: int):
    if ATTN_FORMATS[fmt] is None:
        return (r.randn(num_blocks, BLOCK_SIZE, heads_kv, head_dim),
                r.randn(num_blocks, BLOCK_SIZE, heads_kv, head_dim))
    pools = []
    for codec, scale in zip(ATTN_FORMATS[fmt], (2.0, 1.0)):
        p = QuantizedPages(codec, num_blocks, BLOCK_SIZE, heads_kv, head_dim, r.device)
        step = 1 << 20  # encode in slices (the fp32 source of a 16k x 64 pool is large)
        n = num_blocks * BLOCK_SIZE
        for s0 in range(0, n, step):
            slots = torch.arange(s0, min(n, s0 + step), device=r.device)
            p.write(slots, r.randn(len(slots), heads_kv, head_dim, dtype=torch.float32,
                                   scale=scale))
        pools.append(p)
    return pools


def _kv_bytes(pool, tokens: int) -> int:
    """Bytes of `tokens` tokens of one pool (codes + scales)."""
    if isinstance(pool, torch.Tensor):
        return pool[0, 0].numel() * pool.element_size() * tokens
    per = pool.data[0, 0].numel() * pool.data.element_size() \
        + pool.scale[0, 0].numel() * pool.scale.element_size()
    return per * tokens


def attention_step(r: Runner, fmt: str, qlens: list[int], ctxs: list[int]):
    """Inputs of one step: random block tables over a pool just large enough."""
    kv_heads, heads, head_dim = NUM_KV_HEADS, NUM_HEADS, HEAD_DIM
    if r.dry_run:
        kv_heads, heads, head_dim = 2, 14, 32
    width = max(-(-c // BLOCK_SIZE) for c in ctxs)
    num_blocks = len(ctxs) * width + 8
    k, v = _pools(r, fmt, num_blocks, kv_heads, head_dim)
    perm = torch.randperm(num_blocks, device=r.device)[: len(ctxs) * width]
    tables = perm.view(len(ctxs), width).to(torch.int32)
    qsl = torch.zeros(len(qlens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(qlens).cumsum(0)
    q = r.randn(sum(qlens), heads, head_dim)
    lens = torch.tensor(ctxs, dtype=torch.int32, device=r.device)
    kv_bytes = sum(_kv_bytes(k, c) + _kv_bytes(v, c) for c in ctxs)
    fill = {}
    if fmt.endswith("+fill"):  # every sequence a slot, read from its last block's start
        k.attach_fill(len(ctxs) + 1, torch.bfloat16)
        k.fill.copy_(r.randn(*k.fill.shape, scale=2.0))
        fill = {"fill_slot": torch.arange(len(ctxs), dtype=torch.int32, device=r.device),
                "fill_lo": torch.tensor([(c - 1) // BLOCK_SIZE * BLOCK_SIZE for c in ctxs],
                                        dtype=torch.int32, device=r.device)}
    call = partial(attn.paged_attention_triton, q, k, v, tables, qsl.to(r.device), lens,
                   head_dim ** -0.5, max(qlens), max(ctxs), **fill)
    return call, kv_bytes


def bench_attention(r: Runner) -> None:
    copy = r.results["ceilings"]["copy_tb_s"]
    contexts = [256, 512] if r.dry_run else ATTN_CONTEXTS
    batches = [1, 4] if r.dry_run else ATTN_DECODE_BATCHES
    for ctx in contexts:
        for batch in batches:
            for fmt in r.attn_formats:
                call, kv_bytes = attention_step(r, fmt, [1] * batch, [ctx] * batch)
                us = r.bench_ms(call) * 1e3
                row = {"kind": "decode", "format": fmt, "batch": batch, "context": ctx,
                       "kv_mb": round(kv_bytes / 1e6, 1), "us": round(us, 2),
                       "tb_s": round(kv_bytes / us / 1e6, 3),
                       "fraction_of_copy": round(kv_bytes / us / 1e6 / copy, 3)}
                if fmt == "bf16" and batch in (8, 64) and ctx == contexts[0] \
                        and r.time_left() > 200:
                    row["warps_sweep_us"] = {
                        str(w): round(r.bench_ms(partial(call, num_warps=w)) * 1e3, 2)
                        for w in (4, 8)}
                r.results["attention"].append(row)
                log(f"attention decode {fmt:8s} b={batch:3d} ctx={ctx:5d}: {us:8.1f} us "
                    f"{row['tb_s']:.2f} TB/s ({row['fraction_of_copy']:.0%} of copy) "
                    f"KV {row['kv_mb']} MB" + (f" warps {row['warps_sweep_us']}"
                                               if "warps_sweep_us" in row else ""))
                r.save()
    for d, dctx, p, prefix in ([(4, 256, 64, 0), (0, 0, 128, 64)] if r.dry_run else ATTN_MIXED):
        for fmt in r.attn_formats:
            qlens = [1] * d + [p]
            ctxs = [dctx] * d + [prefix + p]
            call, kv_bytes = attention_step(r, fmt, qlens, ctxs)
            us = r.bench_ms(call) * 1e3
            # causal chunk: queries x visible keys, 2 matmuls of 2 flops per MAC
            pairs = d * dctx + sum(prefix + j + 1 for j in range(p))
            tflops = 4 * pairs * NUM_HEADS * HEAD_DIM / us / 1e6
            row = {"kind": "mixed", "format": fmt, "decodes": d, "decode_context": dctx,
                   "chunk": p, "prefix": prefix, "us": round(us, 2), "tflop_s": round(tflops, 1),
                   "kv_mb": round(kv_bytes / 1e6, 1)}
            if fmt == "bf16" and not r.dry_run and d == 0:
                row["sdpa_flash_us"] = round(_sdpa_us(r, p) * 1e3, 2)
            r.results["attention"].append(row)
            log(f"attention mixed {fmt:8s} {d} decodes (ctx {dctx}) + chunk {p} on prefix "
                f"{prefix}: {us:8.1f} us, {tflops:.0f} TFLOP/s"
                + (f"; torch SDPA (flash, contiguous K/V) {row['sdpa_flash_us']} us"
                   if "sdpa_flash_us" in row else ""))
            r.save()


# (num_warps, block_n, num_stages) for decode; (block_q, num_warps, block_n) for a prefill chunk
SWEEP_DECODE = [(8, 64, 2), (4, 64, 2), (4, 32, 2), (8, 32, 3), (8, 128, 2), (4, 128, 3)]
SWEEP_PREFILL = [(8, 8, 64), (8, 4, 64), (16, 8, 64), (16, 8, 128), (8, 8, 128), (16, 4, 64)]


def bench_attention_sweep(r: Runner) -> None:
    """Tile settings per KV format (decode b=64, ctx 8k) and for a 2048-token prompt (bf16),
    each checked against the reference before it is timed."""
    batch, ctx = (4, 256) if r.dry_run else (64, 8192)
    for fmt in ATTN_FORMATS:
        call, kv_bytes = attention_step(r, fmt, [1] * batch, [ctx] * batch)
        ref = None
        for warps, block_n, stages in SWEEP_DECODE:
            kw = {"num_warps": warps, "block_n": block_n, "num_stages": stages}
            out = call(**kw)
            if ref is None:
                ref = _reference_of(call)
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            us = r.bench_ms(partial(call, **kw)) * 1e3
            row = {"kind": "sweep_decode", "format": fmt, "batch": batch, "context": ctx,
                   **kw, "us": round(us, 2), "rel_err": err,
                   "tb_s": round(kv_bytes / us / 1e6, 3)}
            r.results["attention_sweep"].append(row)
            log(f"sweep decode {fmt:8s} b={batch} ctx={ctx} warps {warps} block_n {block_n} "
                f"stages {stages}: {us:8.1f} us {row['tb_s']:.2f} TB/s err {err:.1e}")
            r.save()
    p = 128 if r.dry_run else 2048
    call, _ = attention_step(r, "bf16", [p], [p])
    ref = _reference_of(call)
    for block_q, warps, block_n in SWEEP_PREFILL:
        kw = {"block_q": block_q, "num_warps": warps, "block_n": block_n}
        out = call(**kw)
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        us = r.bench_ms(partial(call, **kw)) * 1e3
        row = {"kind": "sweep_prefill", "tokens": p, **kw, "us": round(us, 2), "rel_err": err}
        r.results["attention_sweep"].append(row)
        log(f"sweep prefill {p} block_q {block_q} warps {warps} block_n {block_n}: {us:8.1f} us"
            f" err {err:.1e}")
        r.save()


# decode shapes (batch, context) and tiles (num_warps, block_n, num_stages) of the dot-dtype A/B
DOTS_SHAPES = [(1, 8192), (8, 2048), (64, 2048), (8, 8192), (64, 8192)]
DOTS_TILES = [(4, 128, 3), (4, 64, 2), (8, 128, 2), (4, 128, 2)]


def bench_attention_dots(r: Runner) -> None:
    """Quantized pages, fp16 dots (codes dequantized to fp16; the new default) against the bf16
    dots (the earlier default) at the earlier default tiles, decode only, next to bf16 pages at
    its default tiles: each variant checked against the reference first."""
    shapes = [(2, 256), (4, 512)] if r.dry_run else DOTS_SHAPES
    for batch, ctx in shapes:
        base, kv_bf16 = attention_step(r, "bf16", [1] * batch, [ctx] * batch)
        bf16_us = r.bench_ms(base) * 1e3
        row = {"kind": "dots", "format": "bf16", "batch": batch, "context": ctx,
               "us": round(bf16_us, 2), "tb_s": round(kv_bf16 / bf16_us / 1e6, 3)}
        r.results["attention_dots"].append(row)
        log(f"dots bf16 pages b={batch} ctx={ctx}: {bf16_us:8.1f} us {row['tb_s']:.2f} TB/s")
        del base
        for fmt in ("fp8", "int4-fp8"):
            call, kv_bytes = attention_step(r, fmt, [1] * batch, [ctx] * batch)
            ref = _reference_of(call)
            variants = [(False, (4, attn.QUANT_BLOCK_N, attn.QUANT_NUM_STAGES))]
            variants += [(True, t) for t in DOTS_TILES]
            for f16, (warps, block_n, stages) in variants:
                kw = {"num_warps": warps, "block_n": block_n, "num_stages": stages,
                      "quant_f16": f16}
                err = ((call(**kw).float() - ref.float()).norm() / ref.float().norm()).item()
                us = r.bench_ms(partial(call, **kw)) * 1e3
                row = {"kind": "dots", "format": fmt, "batch": batch, "context": ctx,
                       "quant_f16": f16, "num_warps": warps, "block_n": block_n,
                       "num_stages": stages, "us": round(us, 2), "rel_err": err,
                       "tb_s": round(kv_bytes / us / 1e6, 3),
                       "vs_bf16_pages": round(us / bf16_us, 3)}
                r.results["attention_dots"].append(row)
                log(f"dots {fmt:8s} b={batch} ctx={ctx} f16 {f16!s:5} tiles {warps}/{block_n}/"
                    f"{stages}: {us:8.1f} us ({us / bf16_us:.2f}x bf16) {row['tb_s']:.2f} TB/s "
                    f"err {err:.1e}")
                r.save()
            del call, ref


SPLITS_SHAPES = [(1, 8192), (8, 2048), (8, 8192), (8, 16384), (64, 2048), (64, 8192)]
SPLITS_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def split_candidates(batch: int, ctx: int, default: int, sms: int) -> list[int]:
    """Context splits worth timing for a decode of `batch` sequences: the policy's own choice
    first, then every candidate from half to 4x it, up to 8 programs per SM, each split >= 64
    tokens."""
    programs = batch * NUM_KV_HEADS
    return [default] + [s for s in SPLITS_CANDIDATES
                        if s != default and default / 2 <= s <= 4 * default
                        and s * programs <= 8 * sms and s * 64 <= ctx]


def bench_attention_splits(r: Runner) -> None:
    """Decode attention per KV format at every candidate context split (split-K), default tiles
    (and quantized pages at the 64-token tile); each setting checked against the reference
    first. The split policy (`choose_num_splits`) was chosen from this; its own choice is the
    first row of each shape and format."""
    sms = 132 if r.dry_run else torch.cuda.get_device_properties(0).multi_processor_count
    shapes = [(2, 256), (4, 512)] if r.dry_run else SPLITS_SHAPES
    # --attn-formats narrows it (bf16 first: the other rows are relative to it)
    fmts = tuple(f for f in ("bf16", "fp8", "int4-fp8", "int4-fp8+fill") if f in r.attn_formats)
    for batch, ctx in shapes:
        base_us = None
        for fmt in fmts:
            call, kv_bytes = attention_step(r, fmt, [1] * batch, [ctx] * batch)
            ref = _reference_of(call)
            quant = fmt != "bf16"
            if quant:   # the kernel's own plan (int4 keys may take a register cap)
                default = attn.quant_decode_plan(batch * NUM_KV_HEADS, ctx, sms,
                                                 int4_keys=fmt.startswith("int4"))[0]
            else:
                default = attn.choose_num_splits(batch * NUM_KV_HEADS, ctx, sms,
                                                 attn.DECODE_RESIDENT_PER_SM, attn.BLOCK_N)
            variants = [{"num_splits": s} for s in split_candidates(batch, ctx, default, sms)]
            if fmt != "bf16":  # the thinner tile (int4 at 8 x 8k liked it) at 1x / 2x splits
                variants += [{"num_splits": s, "block_n": 64, "num_stages": 2}
                             for s in (default, 2 * default)]
            best = None
            for kw in variants:
                if r.time_left() < 0:
                    log("splits: out of time")
                    return
                try:
                    err = ((call(**kw).float() - ref.float()).norm() / ref.float().norm()).item()
                    us = r.bench_ms(partial(call, **kw), rep_ms=25) * 1e3
                except Exception as exc:  # noqa: BLE001 - record and go on
                    log(f"splits {fmt} b={batch} ctx={ctx} {kw}: {exc!r:.200}")
                    continue
                if fmt == "bf16" and kw["num_splits"] == default:
                    base_us = us
                row = {"kind": "splits", "format": fmt, "batch": batch, "context": ctx, **kw,
                       "default_splits": default, "us": round(us, 2), "rel_err": err,
                       "tb_s": round(kv_bytes / us / 1e6, 3),
                       "vs_bf16_default": round(us / base_us, 3) if base_us else None}
                r.results["attention_splits"].append(row)
                if err < 2e-2 and (best is None or us < best[0]):
                    best = (us, kw)
                log(f"splits {fmt:8s} b={batch:2d} ctx={ctx:5d} {kw}: {us:8.1f} us "
                    f"({row['vs_bf16_default']}x bf16) {row['tb_s']:.2f} TB/s err {err:.1e}"
                    f"{' (default)' if kw == {'num_splits': default} else ''}")
                r.save()
            if best:
                log(f"splits best {fmt} b={batch} ctx={ctx}: {best[1]} {best[0]:.1f} us")
            del call, ref
            torch.cuda.empty_cache() if not r.dry_run else None


def bench_sdpa_gqa(r: Runner) -> None:
    """A whole 2048-token causal prompt with 33B heads (56 q / 8 kv): the engine's eager
    prompt path (kv heads expanded to 56, then SDPA) against SDPA's own GQA and the cuDNN
    backend, each checked against the expanded math result."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    p = 128 if r.dry_run else 2048
    heads, kv_heads, d = (14, 2, 32) if r.dry_run else (NUM_HEADS, NUM_KV_HEADS, HEAD_DIM)
    q = r.randn(1, heads, p, d)
    k = r.randn(1, kv_heads, p, d)
    v = r.randn(1, kv_heads, p, d)
    rep = heads // kv_heads

    def expanded(backends=None):
        ke = k[:, :, None].expand(-1, -1, rep, -1, -1).reshape(1, heads, p, d)
        ve = v[:, :, None].expand(-1, -1, rep, -1, -1).reshape(1, heads, p, d)
        if backends is None:
            return F.scaled_dot_product_attention(q, ke, ve, is_causal=True)
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, ke, ve, is_causal=True)

    def gqa(backends=None):
        if backends is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    ref = expanded().float()
    flops = 4 * p * (p + 1) / 2 * heads * d
    cases = {"expand + default (engine today)": partial(expanded),
             "enable_gqa, default backend": partial(gqa),
             "enable_gqa, flash only": partial(gqa, [SDPBackend.FLASH_ATTENTION]),
             "expand + cudnn": partial(expanded, [SDPBackend.CUDNN_ATTENTION]),
             "enable_gqa, cudnn only": partial(gqa, [SDPBackend.CUDNN_ATTENTION])}
    for name, fn in cases.items():
        try:
            err = ((fn().float() - ref).norm() / ref.norm()).item()
            us = r.bench_ms(fn) * 1e3
        except Exception as exc:  # noqa: BLE001 - a backend may refuse these shapes
            r.results["sdpa"].append({"case": name, "error": repr(exc)[:300]})
            log(f"sdpa {name}: not available ({exc!r:.150})")
            continue
        row = {"case": name, "tokens": p, "us": round(us, 2), "rel_err": err,
               "tflop_s": round(flops / us / 1e6, 1)}
        r.results["sdpa"].append(row)
        log(f"sdpa {name:34s}: {us:8.1f} us {row['tflop_s']:6.1f} TFLOP/s err {err:.1e}")
        r.save()


def _reference_of(call):
    a, kw = call.args, call.keywords
    return attn.paged_attention_reference(a[0], a[1], a[2], a[3], a[4], a[5], a[6],
                                          kw.get("fill_slot"), kw.get("fill_lo"))


def _sdpa_us(r: Runner, p: int) -> float:
    """A whole causal prompt of p tokens through torch SDPA (what the old prefill path ran)."""
    q = r.randn(1, NUM_HEADS, p, HEAD_DIM)
    k = r.randn(1, NUM_HEADS, p, HEAD_DIM)
    v = r.randn(1, NUM_HEADS, p, HEAD_DIM)
    return r.bench_ms(partial(F.scaled_dot_product_attention, q, k, v, is_causal=True))


# ---- 4. fp8 GEMV vs bf16 vs _scaled_mm --------------------------------------------------------

G = fp8.GemvConfig
GEMV_FMA_VARIANTS = [  # (block_n, block_k, warps, stages, programs/SM, use_dot, prefetch)
    G(16, 512, 4, 3, 4, False, False), G(16, 512, 4, 1, 4, False, True),
    G(32, 512, 8, 1, 4, False, True), G(16, 1024, 8, 1, 4, False, True),
    G(8, 1024, 4, 1, 4, False, True), G(16, 512, 4, 3, 8, False, True),
    G(32, 256, 4, 3, 4, False, False), G(16, 256, 2, 1, 8, False, True),
]
GEMV_DOT_VARIANTS = [
    G(64, 128, 4, 4, 4), G(128, 128, 8, 3, 4), G(64, 128, 4, 4, 8), G(128, 128, 8, 4, 8),
    G(64, 256, 4, 3, 8), G(32, 128, 4, 4, 8), G(128, 64, 4, 4, 4), G(64, 64, 4, 6, 8),
]
SWEEP_MS = {1: GEMV_FMA_VARIANTS, 2: GEMV_FMA_VARIANTS + GEMV_DOT_VARIANTS[:2],
            4: GEMV_FMA_VARIANTS[:4] + GEMV_DOT_VARIANTS, 8: GEMV_DOT_VARIANTS,
            16: GEMV_DOT_VARIANTS}


def cfg_list(c: fp8.GemvConfig) -> list:
    return [c.block_n, c.block_k, c.num_warps, c.num_stages, c.programs_per_sm, c.use_dot,
            c.prefetch]


def bench_gemv(r: Runner) -> None:
    copy = r.results["ceilings"]["copy_tb_s"]
    shapes = ({k: (max(16, n // 64), max(16, kk // 64)) for k, (n, kk) in PROJ_SHAPES.items()}
              if r.dry_run else PROJ_SHAPES)
    has_scaled_mm = not r.dry_run
    weights = {}
    for name, (n, k) in shapes.items():
        w = r.randn(n, k, scale=0.02)
        weights[name] = (w, *fp8.quantize_fp8_per_channel(w))
    from backend.kernels.triton_utils import num_sms

    sm_count = 132 if r.dry_run else num_sms(torch.device("cuda"))

    # 4a. tile sweep (each config also checked against the oracle); best config per M by the
    # time of a whole layer (the four shapes summed)
    sweep_on = fp8.use_triton(weights["qkv"][1])
    totals: dict[tuple[int, int], list] = {}
    for m, variants in (SWEEP_MS.items() if sweep_on else ()):
        for name, (n, k) in shapes.items():
            if r.time_left() < 110:
                break
            w, w_fp8, scale = weights[name]
            x = r.randn(m, k)
            ref = fp8.fp8_gemv_reference(x, w_fp8, scale)
            for i, cfg in enumerate(variants):
                out = fp8.fp8_gemv_triton(x, w_fp8, scale, cfg)
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                us = r.bench_ms(partial(fp8.fp8_gemv_triton, x, w_fp8, scale, cfg),
                                rep_ms=25) * 1e3
                r.results["gemv_sweep"].append({
                    "shape": name, "m": m, "config": cfg_list(cfg),
                    "split_k": fp8.split_k_for(n, k, cfg, sm_count)[0], "us": round(us, 2),
                    "tb_s": round((n * k + 2 * m * (k + n)) / us / 1e6, 3),
                    "rel_err": float(f"{err:.2e}")})
                if err <= 1e-2:
                    totals.setdefault((m, i), []).append(us)
        r.save()
    best_cfg: dict[int, fp8.GemvConfig] = {}
    best_rows = []
    for m, variants in SWEEP_MS.items():
        done = [(sum(v), i) for (mm, i), v in totals.items() if mm == m and len(v) == len(shapes)]
        if done:
            layer_us, i = min(done)
            best_cfg[m] = variants[i]
            best_rows.append({"m": m, "config": cfg_list(variants[i]),
                              "layer_us": round(layer_us, 1)})
    r.results["summary"]["gemv_best_config_per_m"] = best_rows
    for row in best_rows:
        log(f"best gemv config M={row['m']:3d}: {row['config']}  layer {row['layer_us']} us")

    # 4b. the table: best swept config (else the code's default) vs bf16 vs _scaled_mm
    for name, (n, k) in shapes.items():
        w, w_fp8, scale = weights[name]
        for m in GEMV_MS:
            x = r.randn(m, k)
            cfg = best_cfg.get(m) or fp8.gemv_config_for(m)
            row = {"shape": name, "n": n, "k": k, "m": m, "config": cfg_list(cfg)}
            row["bf16_us"] = r.bench_ms(partial(F.linear, x, w)) * 1e3
            gemv = partial(fp8.fp8_gemv_triton, x, w_fp8, scale, cfg) if sweep_on else \
                partial(fp8.fp8_gemv, x, w_fp8, scale)
            row["fp8_gemv_us"] = r.bench_ms(gemv) * 1e3
            if has_scaled_mm:
                x_fp8, x_scale = fp8.quantize_fp8_per_token(x)
                sb = scale.view(1, -1)
                try:
                    row["scaled_mm_us"] = r.bench_ms(partial(
                        torch._scaled_mm, x_fp8, w_fp8.t(), scale_a=x_scale, scale_b=sb,
                        out_dtype=torch.bfloat16)) * 1e3
                    row["scaled_mm_with_quant_us"] = r.bench_ms(
                        partial(fp8.fp8_scaled_mm, x, w_fp8, scale)) * 1e3
                except RuntimeError as exc:   # record and keep the GEMV numbers
                    log(f"_scaled_mm failed at M={m} {name}: {exc!r}"[:300])
                    row["scaled_mm_us"] = row["scaled_mm_with_quant_us"] = float("inf")
            act = 2 * m * (k + n)
            row["bf16_tb_s"] = (2 * n * k + act) / row["bf16_us"] / 1e6
            row["fp8_gemv_tb_s"] = (n * k + act) / row["fp8_gemv_us"] / 1e6
            if has_scaled_mm:
                row["scaled_mm_tb_s"] = (n * k + act) / row["scaled_mm_us"] / 1e6
            row["fp8_gemv_fraction_of_copy"] = row["fp8_gemv_tb_s"] / copy
            row["fp8_vs_bf16_speedup"] = row["bf16_us"] / row["fp8_gemv_us"]
            r.results["gemv"].append({key: (round(v, 3) if isinstance(v, float) else v)
                                      for key, v in row.items()})
            log(f"gemv {name:8s} M={m:3d}: bf16 {row['bf16_us']:7.1f} us "
                f"({row['bf16_tb_s']:.2f} TB/s)  fp8-gemv {row['fp8_gemv_us']:7.1f} us "
                f"({row['fp8_gemv_tb_s']:.2f} TB/s, {row['fp8_vs_bf16_speedup']:.2f}x)"
                + (f"  scaled_mm {row['scaled_mm_us']:7.1f} us (+quant "
                   f"{row['scaled_mm_with_quant_us']:7.1f})" if has_scaled_mm else ""))
        r.save()
    summarize_gemv(r, has_scaled_mm)


def summarize_gemv(r: Runner, has_scaled_mm: bool) -> None:
    rows = r.results["gemv"]
    per_m = {}
    for m in GEMV_MS:
        sel = [x for x in rows if x["m"] == m]
        wbytes = sum(x["n"] * x["k"] for x in sel)
        s = {"m": m,
             "layer_bf16_us": round(sum(x["bf16_us"] for x in sel), 1),
             "layer_fp8_gemv_us": round(sum(x["fp8_gemv_us"] for x in sel), 1)}
        s["layer_bf16_tb_s"] = round(2 * wbytes / s["layer_bf16_us"] / 1e6, 3)
        s["layer_fp8_gemv_tb_s"] = round(wbytes / s["layer_fp8_gemv_us"] / 1e6, 3)
        s["fp8_gemv_vs_bf16"] = round(s["layer_bf16_us"] / s["layer_fp8_gemv_us"], 3)
        if has_scaled_mm:
            s["layer_scaled_mm_with_quant_us"] = round(
                sum(x["scaled_mm_with_quant_us"] for x in sel), 1)
            s["layer_scaled_mm_tb_s"] = round(wbytes / sum(x["scaled_mm_us"] for x in sel) / 1e6, 3)
            s["scaled_mm_vs_bf16"] = round(s["layer_bf16_us"] / s["layer_scaled_mm_with_quant_us"], 3)
        per_m[m] = s
    crossover = None
    if has_scaled_mm:  # largest M up to which the GEMV wins for the whole layer at every M
        crossover = 0
        for m in GEMV_MS:
            if per_m[m]["layer_fp8_gemv_us"] <= per_m[m]["layer_scaled_mm_with_quant_us"]:
                crossover = m
            else:
                break
    r.results["summary"]["gemv_per_layer"] = list(per_m.values())
    r.results["summary"]["fp8_gemv_max_m_measured"] = crossover
    r.results["summary"]["fp8_gemv_max_m_in_code"] = fp8.FP8_GEMV_MAX_M
    r.save()


# ---- 5. small fused kernels -------------------------------------------------------------------

def bench_small(r: Runner) -> None:
    for rows in (1, 64, 2048):
        hidden = 256 if r.dry_run else HIDDEN
        inter = 688 if r.dry_run else INTER
        x, res = r.randn(rows, hidden), r.randn(rows, hidden)
        w = r.randn(hidden)
        us = r.bench_ms(partial(fused_add_rms_norm, x, res, w, 1e-6)) * 1e3
        r.results["small_kernels"].append({"kernel": "fused_add_rms_norm", "rows": rows,
                                           "us": round(us, 2),
                                           "gb_s": round(4 * x.numel() * 2 / us / 1e3, 1)})
        gu = r.randn(rows, 2 * inter)
        us = r.bench_ms(partial(silu_and_mul, gu)) * 1e3
        r.results["small_kernels"].append({"kernel": "silu_and_mul", "rows": rows,
                                           "us": round(us, 2),
                                           "gb_s": round(3 * rows * inter * 2 / us / 1e3, 1)})
        heads, kvh, hd = (14, 2, 32) if r.dry_run else (NUM_HEADS, NUM_KV_HEADS, HEAD_DIM)
        qkv = r.randn(rows, (heads + 2 * kvh) * hd)
        q = qkv[:, : heads * hd].view(rows, heads, hd)
        k = qkv[:, heads * hd: (heads + kvh) * hd].view(rows, kvh, hd)
        v = qkv[:, (heads + kvh) * hd:].view(rows, kvh, hd)
        cos, sin = build_rope_cache(4096, hd, 100000.0, 4.0, device=r.device)
        pos = torch.randint(0, 4096, (rows,), device=r.device)
        nblk = rows // BLOCK_SIZE + 2
        kc, vc = r.randn(nblk, BLOCK_SIZE, kvh, hd), r.randn(nblk, BLOCK_SIZE, kvh, hd)
        slots = torch.randperm(nblk * BLOCK_SIZE, device=r.device)[:rows]
        us = r.bench_ms(partial(rotary_kv_write, pos, q, k, v, cos, sin, kc, vc, slots)) * 1e3
        moved = (2 * (heads + kvh) + 2 * kvh) * hd * rows * 2
        r.results["small_kernels"].append({"kernel": "rotary_kv_write", "rows": rows,
                                           "us": round(us, 2), "gb_s": round(moved / us / 1e3, 1)})
    for x in r.results["small_kernels"]:
        log(f"{x['kernel']:20s} rows={x['rows']:5d}: {x['us']:8.2f} us  {x['gb_s']:8.1f} GB/s")
    r.save()


def print_table(r: Runner) -> None:
    res = r.results
    log("\n==== summary ====")
    log(f"tests: {res['tests'].get('summary')} (rc {res['tests'].get('returncode')})")
    c = res["ceilings"]
    log(f"ceilings: copy {c.get('copy_tb_s')} TB/s, bf16 matmul {c.get('bf16_matmul_tflop_s')} "
        f"TFLOP/s")
    for a in res["attention"]:
        if a["kind"] == "decode":
            log(f"attn decode {a['format']:8s} b={a['batch']:3d} ctx={a['context']:5d}: "
                f"{a['us']:8.1f} us {a['fraction_of_copy']:.0%} of copy")
        else:
            log(f"attn mixed {a['format']:8s} d={a['decodes']} c={a['decode_context']} + "
                f"{a['chunk']} on {a['prefix']}: {a['us']:8.1f} us {a['tflop_s']} TFLOP/s")
    for s in res["summary"].get("gemv_per_layer", []):
        log(f"layer M={s['m']:3d}: bf16 {s['layer_bf16_us']:7.1f} us ({s['layer_bf16_tb_s']} TB/s)"
            f"  fp8-gemv {s['layer_fp8_gemv_us']:7.1f} us ({s['layer_fp8_gemv_tb_s']} TB/s, "
            f"{s['fp8_gemv_vs_bf16']}x)"
            + (f"  scaled_mm+quant {s['layer_scaled_mm_with_quant_us']:7.1f} us "
               f"({s['scaled_mm_vs_bf16']}x)" if "scaled_mm_vs_bf16" in s else ""))
    log(f"measured crossover (GEMV wins up to M): {res['summary'].get('fp8_gemv_max_m_measured')}"
        f"; in code FP8_GEMV_MAX_M = {fp8.FP8_GEMV_MAX_M}")
    for b in res["summary"].get("gemv_best_config_per_m", []):
        log(f"best gemv config M={b['m']:3d}: {b['config']}  layer {b['layer_us']} us")
    log(f"elapsed {r.elapsed():.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    parser.add_argument("--dry-run", action="store_true", help="CPU plumbing check, toy sizes")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--tests", default="tests/test_kernels_gpu.py",
                        help="pytest paths run with -m gpu (space separated)")
    parser.add_argument("--sections", default="ceilings,attention,gemv,small",
                        help="which timing sections to run (also: sweep, dots, sdpa, splits)")
    parser.add_argument("--attn-formats", default=",".join(ATTN_FORMATS),
                        help="KV formats of the attention section")
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="skip optional sweeps when this much time has passed")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.dry_run and not torch.cuda.is_available():
        log("no CUDA device (use --dry-run on the CPU)")
        return 2
    r = Runner(out_dir, args.dry_run, args.budget_s)
    r.attn_formats = args.attn_formats.split(",")
    meta = r.results["meta"]
    meta["torch"] = torch.__version__
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    if not args.dry_run:
        props = torch.cuda.get_device_properties(0)
        meta.update(gpu=props.name, sms=props.multi_processor_count,
                    capability=list(torch.cuda.get_device_capability(0)))
    log(json.dumps(meta))
    r.save()
    if not args.skip_tests:
        run_tests(r, args.tests.split())
    named = {"ceilings": measure_ceilings, "attention": bench_attention,
             "sweep": bench_attention_sweep, "gemv": bench_gemv, "small": bench_small,
             "dots": bench_attention_dots, "sdpa": bench_sdpa_gqa,
             "splits": bench_attention_splits}
    steps = [named[x] for x in args.sections.split(",")]
    if measure_ceilings not in steps:
        steps.insert(0, measure_ceilings)
    for step in steps:
        try:
            step(r)
        except Exception as exc:  # noqa: BLE001 - keep going: later sections still report
            import traceback
            traceback.print_exc()
            r.results.setdefault("errors", []).append(f"{step.__name__}: {exc!r}"[:500])
            r.save()
    print_table(r)
    r.save()
    return 0 if r.results["tests"].get("returncode", 0) == 0 and "errors" not in r.results else 1


if __name__ == "__main__":
    sys.exit(main())
