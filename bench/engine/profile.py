"""`tidegate backend profile`: measure step times for the simulator's measured cost model.

Runs the real runner (model + sampler) on synthetic steps over a grid of
(decode batch size d, prefill tokens p, context length c) and writes the profile JSON
described in docs/contracts.md ("profile JSON"). Each point is one step holding d decodes whose
context is c tokens each, plus (if p > 0) k prefill chunks of p / k tokens each, every one starting
at position s (its cached prefix). The main grid has k = 1, s = 0; extra points measure packed
prefills (k in --packed-prefill-seqs, several prompts in one step) and chunks with a cached prefix
(s in --prefill-context-lens, chunked prefill), so the simulator can tell them from one long prompt.
One more packed point fills the token budget beside the middle packed decode batch where the grid's
largest p does not fit there (--budget-packed-points): the engine's largest live steps, several
prompts beside the decodes up to the budget (`step_shapes`). Spread decode points
(--decode-spread-points) give the d decodes unequal contexts, d - 1 short and one long
(`spread_shapes`), and the profile writes the decode kernel's launch plan per decode bucket
(`decode_attention`): what a batch of unequal contexts costs the one-program-per-sequence launch;
with --mixed-spread-points, the same decodes beside one prefill chunk (the mixed step's tiling).
Tile-edge pairs (--tile-edge-pairs) time every decode on a tile edge, one token past it and at the
next edge, in turn, alone and beside that chunk (`tile_edge_pairs`): what a partial attention tile
costs on the card as a fraction of a whole one (the older off-edge points, --tile-edge-points, time
only the second, read against the fit).
Verify points (--verify-drafts K) hold k verify chunks of K + 1 tokens instead (a decode with K
draft tokens, speculative decoding): the same tokens as a prefill chunk through the model, but
sampled at every position and read back row by row, which a prefill chunk's shape does not time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from itertools import pairwise

import torch

from backend.engine.args import int_list
from backend.errors import ModelLoadError
from scheduler.step_plan import ScheduledChunk
from sims.decode_spread import expand_context_lens

FORMAT = "tidegate-profile/1"


def _chunk(request_id, token_ids, start_pos, block_table, is_prefill, num_draft=0) -> ScheduledChunk:
    """A step chunk for a synthetic step; every chunk samples (the runner reads all of them)."""
    return ScheduledChunk(request_id, token_ids, start_pos, block_table, is_prefill, True, num_draft)


def parser() -> argparse.ArgumentParser:
    from backend.engine.args import add_engine_args

    p = argparse.ArgumentParser(prog="tidegate backend profile",
                                description="Measure step times over (decode batch, prefill tokens, context).")
    add_engine_args(p)
    # the serving backend's weight format, so that a profile of an FP8 deployment measures FP8
    # steps (`sim validate --engine-arg=--quantization=fp8` passes it to both)
    p.add_argument("--quantization", default="none", choices=["none", "fp8"],
                   help="weights as the serving backend's flag: fp8 = E4M3 weights, "
                        "per-output-channel scales (CUDA, capability >= 8.9)")
    p.add_argument("--fp8-gemv-max-m", type=int, default=None, metavar="ROWS",
                   help="fp8 weights: the serving backend's GEMV / _scaled_mm switch (recorded in the "
                        "profile as fp8_gemv_max_m; default: the engine's, 16 since session 41)")
    p.add_argument("--out", required=True, help="path of the profile JSON to write")
    p.add_argument("--decode-batch-sizes", default="0,1,8,32,64", help="comma-separated d values")
    p.add_argument("--prefill-tokens", default="0,128,512,2048", help="comma-separated p values")
    p.add_argument("--context-lens", default="128,1024", help="comma-separated decode context lengths c")
    p.add_argument("--packed-prefill-seqs", default="2,4",
                   help="comma-separated k > 1: extra points with the prefill tokens split into k "
                        "equal prompts in one step ('' = none)")
    p.add_argument("--prefill-context-lens", default="",
                   help="comma-separated s > 0: extra points with one prefill chunk starting at "
                        "position s (a cached prefix; '' = none)")
    p.add_argument("--packed-decode-batch-sizes", default=None,
                   help="d values of the packed / cached-prefix points (default: 0 and the largest "
                        "grid d that fits)")
    p.add_argument("--budget-packed-points", choices=("on", "off"), default="on",
                   help="on: one more packed point of the largest k filling the token budget "
                        "beside the middle packed decode batch (the largest grid d <= half the "
                        "largest packed d; the validate's grid: d 64, 4 x 496 tokens), where the "
                        "grid's largest p does not fit beside it: the engine's budget-filling "
                        "packed steps (issue 35)")
    p.add_argument("--verify-drafts", default="",
                   help="comma-separated K > 0: extra points whose chunks are verifies of K draft "
                        "tokens (K + 1 tokens each, sampled at every position) instead of prefill "
                        "chunks, with k in 1 and --packed-prefill-seqs and s in "
                        "--prefill-context-lens, beside the packed decode batches ('' = none)")
    p.add_argument("--decode-bucket-points", choices=("on", "buckets", "off"), default="on",
                   help="on a device with CUDA graphs, also a decode-only point at every decode "
                        "graph bucket between the grid's smallest and largest decode batch (24 and "
                        "48 beside 1-64) and ('on') at every bucket's first two batches, the "
                        "bucket before it + 1 and + 2 (3, 5, 6, 9, 10, 17, 18, 25, 26, 33, 34, 49, "
                        "50): a decode step runs its bucket's "
                        "rows, so its time jumps past each bucket and rises inside it, which the "
                        "cost model follows bucket by bucket (issue 35); 'buckets': the buckets "
                        "alone (the profiles of 2026-12-04)")
    p.add_argument("--decode-conditioning", choices=("on", "off"), default="on",
                   help="on: a decode-only point measured right after another decode-only point (the "
                        "decode-bucket and spread points) first runs the grid's mixed step beside its "
                        "decodes, paused, as every grid decode point follows the grid's paused mixed "
                        "points; 'off': the profiles before 2026-12-07, whose bucket points read ~1.8 %% "
                        "under live on the H100 (issue 35, session 32)")
    p.add_argument("--mixed-spread-points", choices=("on", "off"), default="on",
                   help="on (with --decode-spread-points on): also each spread point's decodes beside "
                        "one prefill chunk of the pause check's mixed step (256 tokens, within the "
                        "token budget), paused as the grid's mixed points: the capped engine's mixed "
                        "step of unequal contexts, whose attention runs another tiling of the kernel "
                        "(recorded; the cost model keeps them out of its fit)")
    p.add_argument("--decode-spread-points", choices=("on", "off"), default="on",
                   help="on: also one decode-only point per grid decode batch d >= 2 whose d - 1 "
                        "sequences have the first --context-lens context and the last one 4x it "
                        "(capped at max_model_len): a live batch's unequal contexts, which the "
                        "decode kernel's one program per (sequence, kv head, split) runs as a "
                        "tail on the long one (issue 35, session 19); `decode_context_lens` "
                        "gives each point's contexts")
    p.add_argument("--tile-edge-pairs", choices=("on", "off"), default="on",
                   help="on (default, with --decode-spread-points on): also time, per grid decode batch "
                        "d >= 8, every decode on a tile edge (the first --context-lens context rounded up "
                        "to 128 tokens), one token past it and at the next 128-token edge, in turn, alone "
                        "and (with --mixed-spread-points on) beside the mixed spread points' chunk: what a "
                        "partial attention tile costs on the card as a fraction of a whole one, which the "
                        "cost model reads (`tile_edge_pairs`; issue 35, session 35; ~+15 s on a 6.7B, "
                        "~+30 s on a 33B)")
    p.add_argument("--tile-edge-points", choices=("on", "off"), default="off",
                   help="on (with --decode-spread-points on): also, per spread point's d, a grid point "
                        "with every decode one token past a 64-token tile edge, alone and beside the "
                        "mixed spread points' chunk (`decode_spread` \"off_edge\", kept out of the fit; "
                        "session 34's form, read against the fit: too noisy for the fraction, so off by "
                        "default since session 35; the cost model reads them where a profile has no pairs)")
    p.add_argument("--kv-block-order", choices=BLOCK_ORDERS, default="contiguous",
                   help="how every point's decode block tables lie in the KV pool (`decode_tables`): "
                        "contiguous (default, the profiles so far), interleaved (as the engine's "
                        "allocator hands blocks to decodes growing together) or scattered (a seeded "
                        "permutation of the pool)")
    p.add_argument("--kv-fill", choices=KV_FILLS, default="random",
                   help="what the KV pool holds while the points are measured (`fill_kv_pool`): random "
                        "(default since issue 35, session 29: seeded standard-normal pages, as a live pool "
                        "holds non-zero K/V) or zeros (the fresh pool every profile read before). "
                        "Measured (session 31, H100 6.7B FP8): a filled profile's points read a zeroed "
                        "one's +0.15%% on average, so the fill is realism, not a correction. A "
                        "quantized pool (int4 / fp8 codes with scales) gets the codes and scales of "
                        "the same draws")
    p.add_argument("--block-order-check", choices=("on", "off"), default="on",
                   help="on: also, after every other measurement, the decode points at d in "
                        "BLOCK_ORDER_CHECK_DS (those the grid has) and the first --context-lens "
                        "context in each block order over the zeroed pool, then contiguous over "
                        "contexts the model prefilled, timed as the grid's decode points "
                        "(`block_order_check` in the profile: recorded, not read by the cost "
                        "model): whether where the KV blocks lie, or what they hold, changes a "
                        "decode step's time (issue 35, session 21)")
    p.add_argument("--pause-check", choices=("on", "off"), default="on",
                   help="on (with --pause-ms > 0): after the grid, the pause check (`compare_pause`: the "
                        "grid's prefill steps paused and back to back, and the sustained runs the cost "
                        "model's power terms read); off: the grid alone (`sim validate`'s profile check, "
                        "bench.simulator.profile_check)")
    p.add_argument("--device-time", choices=("on", "off"), default="on",
                   help="on CUDA, also time each point as the serving loop runs it: queued behind "
                        "a spin kernel that holds the stream while the host launches, so the "
                        "step's own ops run back to back, timed by the CUDA events the live step "
                        "log reads (`device_ms_median`; the same pause before each repetition). "
                        "The cost model fits these where every point has them: step minus launch "
                        "cannot tell a launch the device waited through from one it ran beside "
                        "(issue 35, session 17). Adds the points' repetitions once more")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per point")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions per point")
    p.add_argument("--pause-ms", type=float, default=0.0,
                   help="idle time before each repetition of a step with prefill tokens (0: "
                        "back to back). On the H200 a compute-bound step measured back to back "
                        "runs at the lower clocks of sustained full load, which the serving loop, "
                        "interleaving prefills with memory-bound decode steps, rarely reaches")
    return p


BLOCK_ORDERS = ("contiguous", "interleaved", "scattered")
KV_FILLS = ("random", "zeros")
FILL_SLICE_BYTES = 256 << 20  # the largest float32 draw `fill_kv_pool` makes at once


@torch.inference_mode()
def fill_kv_pool(runner, how: str = "random") -> str:
    """Set every K/V page of the pool: "random" seeded standard-normal values in the pages' dtype,
    "zeros" zeros. Why (issue 35, session 29): a fresh pool is zeroed, and the profile's points
    read it; a live pool holds the model's non-zero K/V, and session 29's replays of 700 live H100
    6.7B FP8 steps read 1.7% under live over zeros and 0.3-0.5% under it over random pages. Those
    two replays ran in separate device calls, though, and session 31's profile over a filled pool
    measured the decode points 0.15% over the zeroed profile's on average (p10-p90 0.997-1.007),
    and the live steps' excess over them unchanged (bench/results/fidelity_h100_s31): the fill is
    kept because a live pool is not zeroed, not because it moves the points.

    A quantized pool (`QuantizedPages`: fp8 or int4 codes with scales) gets the codes and scales of
    the same draws, quantized as its writer quantizes them, and its fill rows (the int4 keys' block
    being filled, model dtype) the draws themselves: a zeroed one holds all-zero scales and codes
    that decode to 0, which no live pool holds (the H200 33B int4-fp8 part's uncapped live decode
    steps ran 1.000-1.004 of its zero-pool profile at d <= 32 and 1.012-1.014 at d 33-64: session
    30; whether the zeros are why is for its next part to say). Returns `how`, or "zeros (pool of
    another kind)" where a cache is neither (left as it is)."""
    from backend.kv.formats import QuantizedPages

    caches = (*runner.kv.k_caches, *runner.kv.v_caches)
    if not all(isinstance(c, QuantizedPages)
               or (isinstance(c, torch.Tensor) and c.dtype.is_floating_point) for c in caches):
        return "zeros (pool of another kind)"
    g = torch.Generator(device=runner.device).manual_seed(0)

    def draw(shape) -> torch.Tensor:
        return torch.randn(shape, generator=g, device=runner.device, dtype=torch.float32)

    for c in caches:
        quantized = isinstance(c, QuantizedPages)
        fill = c.fill if quantized else None
        if how == "zeros":
            for t in ((c.data, c.scale) if quantized else (c,)) + (() if fill is None else (fill,)):
                t.zero_()
            continue
        # in slices of blocks, through float32 draws of at most FILL_SLICE_BYTES: the pool takes
        # most of the device's memory, a layer's page tensor up to a few GB. A quantized slice
        # also holds the quantizer's temporaries (a few times the draw): an eighth of the bytes
        row = int(torch.Size(c.shape[1:]).numel())
        step = max(1, FILL_SLICE_BYTES // (8 if quantized else 1) // max(1, 4 * row))
        for lo in range(0, c.shape[0], step):
            hi = min(lo + step, c.shape[0])
            x = draw((hi - lo, *c.shape[1:]))
            if quantized:  # codes as raw bytes: torch copies no float8 <- float8 on every device
                codes, scale = c.quantize(x)
                c.data[lo:hi].view(torch.uint8).copy_(codes.view(torch.uint8))
                c.scale[lo:hi].copy_(scale)
            else:
                c[lo:hi].copy_(x)
        if fill is not None:
            fill.copy_(draw(fill.shape))
    if runner.device.type == "cuda":
        torch.cuda.synchronize()
    return how


def decode_tables(sizes: Sequence[int], num_blocks: int, order: str = "contiguous",
                  seed: int = 0) -> tuple[list[list[int]], int]:
    """Block tables of `sizes[i]` blocks for the decodes, laid out in the pool as `order` says, and
    the first block past them (where the prefill chunks' tables start; tables wrap around the
    pool). "contiguous": each table one run after the one before (the profile's points since the
    first session); "interleaved": block j of every still-growing table next to the others' j-th,
    round-robin, as the engine's allocator hands out blocks to decodes that grow together (a
    fresh block for each every block_size tokens, `scheduler.block_manager`); "scattered": every
    block drawn from a seeded permutation of the pool, a long-running engine's free list at its
    most mixed. Why: on the H100's 6.7B parts live decode steps ran up to 1-2% over the profile's
    device times at the same shape, the excess growing with the batch (issue 35, session 21)."""
    if order not in BLOCK_ORDERS:
        raise ValueError(f"block order must be one of {', '.join(BLOCK_ORDERS)}, got {order!r}")
    total = sum(sizes)
    if order == "contiguous":
        out, nxt = [], 0
        for n in sizes:
            out.append([(nxt + j) % num_blocks for j in range(n)])
            nxt += n
        return out, nxt
    if order == "interleaved":
        out = [[] for _ in sizes]
        nxt = 0
        for j in range(max(sizes, default=0)):
            for i, n in enumerate(sizes):
                if j < n:
                    out[i].append(nxt % num_blocks)
                    nxt += 1
        return out, nxt
    perm = list(range(num_blocks))
    random.Random(seed).shuffle(perm)
    flat = [perm[j % num_blocks] for j in range(total)]
    out, at = [], 0
    for n in sizes:
        out.append(flat[at:at + n])
        at += n
    return out, total


def make_step(d: int, p: int, c: int, block_size: int, num_blocks: int, vocab: int,
              k: int = 1, s: int = 0, verify: bool = False,
              decode_contexts: Sequence[int] | None = None,
              block_order: str = "contiguous") -> list[ScheduledChunk]:
    """d decodes of context c, then k prefill chunks of p // k tokens each (p % k == 0), each
    starting at position s; block tables wrap around the pool. `verify`: the k chunks are
    verifies instead (a decode whose last p // k - 1 tokens are drafts), after the decodes.
    `decode_contexts` (d values, each >= 1): the decodes' own contexts in launch order instead
    of c for all (`spread_shapes`: a batch of unequal contexts). `block_order`: how the decodes'
    tables lie in the pool (`decode_tables`)."""
    chunks: list[ScheduledChunk] = []
    if decode_contexts is None:
        ctxs = [c] * d
    else:
        ctxs = [int(x) for x in decode_contexts]
        if len(ctxs) != d or any(x < 1 for x in ctxs):
            raise ValueError(f"{d} decodes need {d} contexts >= 1, got {ctxs}")
    tables, next_block = decode_tables([-(-ci // block_size) for ci in ctxs], num_blocks, block_order)

    def table(n: int) -> list[int]:
        nonlocal next_block
        t = [(next_block + i) % num_blocks for i in range(n)]
        next_block += n
        return t

    for i, ci in enumerate(ctxs):
        chunks.append(_chunk(f"d{i}", [(7 * i + 1) % vocab], ci - 1, tables[i], False))
    if p:
        if k < 1 or p % k:
            raise ValueError(f"{p} prefill tokens do not split into {k} equal chunks")
        n = p // k
        for i in range(k):
            ids = [(13 * j + 5 + i) % vocab for j in range(n)]
            chunks.append(_chunk(f"v{i}" if verify else f"p{i}", ids, s,
                                 table(-(-(s + n) // block_size)), not verify,
                                 n - 1 if verify else 0))
    return chunks


def verify_shapes(drafts: list[int], ks: list[int], ss: list[int], packed_ds: list[int], c: int, *,
                  max_num_seqs: int, max_num_batched_tokens: int,
                  max_model_len: int) -> list[tuple[int, int, int, int, int]]:
    """Verify points as (d, p, c, k, s): k verifies of K + 1 tokens (p = k (K + 1)) at position s
    (s in `ss`, or 0) beside d decodes of context c, for K in `drafts`, k in 1 and `ks`, d in
    `packed_ds`."""
    shapes = []
    for kd in (x for x in drafts if x > 0):
        for d in packed_ds:
            for k in sorted({1, *(x for x in ks if x > 1)}):
                for s in [x for x in ss if x > 0] or [0]:
                    p = k * (kd + 1)
                    if (d + k <= max_num_seqs and d + p <= max_num_batched_tokens
                            and max(c if d else 0, s + kd + 1) <= max_model_len):
                        shapes.append((d, p, c if d else 0, k, s))
    return shapes


def step_shapes(ds: list[int], ps: list[int], cs: list[int], ks: list[int], ss: list[int],
                packed_ds: list[int] | None, *, max_num_seqs: int, max_num_batched_tokens: int,
                max_model_len: int, budget_packed: bool = True) -> list[tuple[int, int, int, int, int]]:
    """The measured step shapes, as (d, p, c, k, s): the (d, p, c) grid with k = 1, s = 0, then
    packed prefills (k > 1, s = 0) and cached-prefix chunks (k = 1, s > 0) at the first context
    length and the `packed_ds` decode batches (default: 0 and the largest grid d that fits).

    `budget_packed`: one more packed point filling the token budget (p = budget - d, down to a
    multiple of the largest k, in k prompts) at the middle of the packed decode batches (the largest
    grid d <= half the largest packed d: 64 on the validate's grid, 4 x 496 tokens), where the
    grid's largest p does not fit beside it. Why: under load the engine fills its budget with
    several prompts beside the decodes (live on the H200, 6.7B / 33B FP8: d + p = 2,048, d 27-90,
    median 58-71, 4-5 prompts, 3-5% of the busy time), and the grid's points past 1,024 tokens all
    had d 0: the cost model extrapolated there (the 6.7B FP8 charged them 0.935 of live). Why the
    middle: those steps lie just outside the model's residual hull either way (their decodes'
    context, a cached-prefix chunk), charged the nearest point's residual, so the point sits where
    they are; a stand-in at d 128 moved them half as far (bench/results/fidelity_hull_s18). One
    point: ~0.7 s of device time on the 6.7B, ~1.4 s on the 33B."""
    def fits(d, p, c, k, s):
        return (d + p > 0 and d + (k if p else 0) <= max_num_seqs and d + p <= max_num_batched_tokens
                and max(c if d else 0, s + (p // k if p else 0)) <= max_model_len)

    shapes = []
    for c in cs:
        for d in ds:
            for p in ps:
                if d == 0 and c != cs[0]:
                    continue  # prefill-only points do not depend on c
                if fits(d, p, c, 1, 0):
                    shapes.append((d, p, c if d else 0, 1, 0))
    if not cs:
        return shapes
    c = cs[0]
    if packed_ds is None:
        fit_ds = [d for d in ds if d and any(fits(d, p, c, 1, 0) for p in ps if p)]
        packed_ds = [0] + ([max(fit_ds)] if fit_ds else [])
    extra = [(k, 0) for k in ks if k > 1] + [(1, s) for s in ss if s > 0]
    for d in packed_ds:
        for k, s in extra:
            for p in ps:
                if p and p % k == 0 and fits(d, p, c, k, s):
                    shapes.append((d, p, c if d else 0, k, s))
    k_top, p_top = max([1] + [k for k in ks if k > 1]), max([0] + list(ps))
    mid = [d for d in ds if 0 < d <= max([0] + list(packed_ds)) / 2]
    if budget_packed and k_top > 1 and p_top and mid:
        d = max(mid)
        p = (max_num_batched_tokens - d) // k_top * k_top
        # only where the grid's own points do not reach the budget beside d
        if (not fits(d, p_top, c, 1, 0) and p > max([0] + [x for x in ps if fits(d, x, c, 1, 0)])
                and fits(d, p, c, k_top, 0)):
            shapes.append((d, p, c, k_top, 0))
    return shapes


def decode_bucket_shapes(shapes: list[tuple[int, int, int, int, int]], buckets,
                         cs: list[int], first_batches: bool = False) -> list[tuple[int, int, int, int, int]]:
    """Decode-only shapes (d, 0, c, 0, 0) for every decode-graph bucket d strictly between the
    smallest and largest decode batch of `shapes` that the grid lacks, at each context in `cs`;
    with `first_batches`, also every bucket's first two batches (the bucket before it + 1 and + 2,
    where they are not that bucket itself) above the smallest decode batch and up to the largest:
    the steps past a bucket's edge, where the graph's rows jump (live 6.7B: 16 -> 17 but 33 -> 34
    and 49 -> 50; sims.profile_cost interpolates inside buckets)."""
    ds = sorted({d for d, p, *_ in shapes if d and not p})
    if not ds:
        return []
    have = {(d, c) for d, p, c, *_ in shapes if not p}
    bs = sorted(set(buckets))
    want = {b for b in bs if ds[0] < b < ds[-1]}
    if first_batches:  # a bucket's first two batches (the 6.7B's steps jumped at 33 -> 34, 49 -> 50)
        want |= {x for lo, hi in pairwise(bs) for x in (lo + 1, lo + 2) if x < hi and ds[0] < x <= ds[-1]}
    return [(b, 0, c, 0, 0) for b in sorted(want) for c in cs if (b, c) not in have]


# "Spread" decode points (--decode-spread-points, issue 35, session 19): the grid's decode points
# give all d sequences the same context c, but a live decode batch's contexts differ (the H100's
# mixed-lengths run, prompts lognormal median 512 sigma 0.8: decode-only steps charged 0.92 of
# live, falling from 0.98 at max/mean context 1 to 0.88 at max/mean 3+), and charging a step by
# its total context prices it at the mean. The paged-attention decode launch runs one program per
# (sequence, kv head, split), so where one sequence is longer the launch waits on its programs
# after the others finish, streaming alone faster than its share at full occupancy: how much
# faster is what these points measure, d - 1 sequences at the first context and the last one
# SPREAD_LONG_FACTOR x longer, beside the kernel's launch plan (`decode_attention_plan`).
SPREAD_LONG_FACTOR = 4


def spread_shapes(ds: list[int], cs: list[int], *, max_num_seqs: int, max_num_batched_tokens: int,
                  max_model_len: int) -> list[tuple[int, list[list[int]]]]:
    """The spread decode points as (d, run-length contexts [[count, context], ...] in launch
    order): for every grid decode batch d >= 2 that fits, d - 1 sequences at c_short (the first
    of `cs`) and the last at c_long = min(SPREAD_LONG_FACTOR * c_short, max_model_len); none where
    c_long <= c_short."""
    if not cs:
        return []
    c_short = cs[0]
    c_long = min(SPREAD_LONG_FACTOR * c_short, max_model_len)
    if c_short < 1 or c_long <= c_short:
        return []
    out = []
    for d in dict.fromkeys(ds):
        if 2 <= d <= min(max_num_seqs, max_num_batched_tokens):
            out.append((d, [[d - 1, c_short], [1, c_long]]))
    return out


# "Off-edge" points (--tile-edge-points, issue 35, session 34): the paged kernel runs a decode's context
# in 64-token tiles (a decode beside a chunk as a 64-row program), and a tile costs more than its share
# of keys: on an H100's 6.7B, every decode one key past a tile edge cost a mixed step +0.9-2.4 % and a
# decode-only step +0.8-1.4 %, where contexts spread over whole tiles cost nothing more (bench/results/
# tiles_s34). The grid's contexts sit on tile edges; these points put every decode one token past one,
# so that the cost model can read the fraction of a whole tile a partial one costs on this card.
TILE_EDGE_TOKENS = 64


def tile_edge_shapes(ds: list[int], cs: list[int], *, max_num_seqs: int, max_num_batched_tokens: int,
                     max_model_len: int) -> list[tuple[int, list[list[int]]]]:
    """The off-edge decode points as (d, [[d, c_edge + 1]]): c_edge the first of `cs` rounded up to
    a whole tile, for every grid decode batch d >= 2 that fits; none where the tile past it does
    not fit the model's length."""
    if not cs or cs[0] < 1:
        return []
    edge = -(-int(cs[0]) // TILE_EDGE_TOKENS) * TILE_EDGE_TOKENS
    if edge + TILE_EDGE_TOKENS >= max_model_len:
        return []
    return [(d, [[d, edge + 1]]) for d in dict.fromkeys(ds)
            if 2 <= d <= min(max_num_seqs, max_num_batched_tokens)]


# Tile-edge pairs (--tile-edge-pairs, the default since issue 35's session 35). Read against the fit,
# the off-edge points above gave a fraction of a tile anywhere from -0.4 to 8 per point on an H100's
# 6.7B profile (bench/results/tiles_s35): a partial tile moves a step by 0.5-2.5 %, about the fit's own
# residual there, and that profile's decode-only points at d >= 32 ran at a ~10 % lower SM clock than
# the smaller ones. So each shape is timed on the edge, one token past it and at the next edge, in turn
# (each round reverses the order), and the cost model reads the first difference over the second: a
# fraction of a whole tile measured on both sides, out of which the fit (whose context slope between
# the grid's contexts is as noisy: for the same whole tile beside a chunk at d 8 the two H100 profiles
# of session 35 charge 0.03 and 0.20 ms) and the clock's drift drop.
TILE_PAIR_EDGE = 128     # a multiple of every decode tile (64 tokens; 128 over quantized pages)
TILE_PAIR_ROUNDS = 4
TILE_PAIR_MIN_D = 8      # below it a partial tile's cost is under the timing's noise


def tile_pair_shapes(ds: list[int], cs: list[int], *, max_num_seqs: int, max_num_batched_tokens: int,
                     max_model_len: int) -> list[tuple[int, int]]:
    """(d, edge) of each tile-edge pair: edge the first of `cs` rounded up to TILE_PAIR_EDGE, d each
    grid decode batch >= TILE_PAIR_MIN_D that fits (where none reaches it, the largest d >= 2 that
    fits); none where the next twin (the edge + TILE_PAIR_EDGE) does not fit the model's length."""
    if not cs or cs[0] < 1:
        return []
    edge = -(-int(cs[0]) // TILE_PAIR_EDGE) * TILE_PAIR_EDGE
    if edge + TILE_PAIR_EDGE >= max_model_len:
        return []
    fit = sorted({d for d in ds if 2 <= d <= min(max_num_seqs, max_num_batched_tokens)})
    return [(d, edge) for d in ([d for d in fit if d >= TILE_PAIR_MIN_D] or fit[-1:])]


def tile_edge_pairs(runner, pairs: Sequence[tuple[int, int]], cfg, vocab: int, repeats: int,
                    pause_s: float, chunk_tokens: int, rounds: int = TILE_PAIR_ROUNDS) -> list[dict]:
    """Per (d, edge) of `pairs`: d decodes all at the edge ("on"), all one token past it ("off") and
    all at the next TILE_PAIR_EDGE edge ("next": whole tiles only, what the model's context term
    should charge), alone (back to back, as the grid's decode points) and, with `chunk_tokens` > 0,
    beside one chunk of that many tokens at position 0 (each repetition after `pause_s` idle, as the
    grid's points with prefill). Each round times the three, `repeats` each (one warm-up in the
    first round), in turn, on-off-next in even rounds and next-off-on in odd ones; a record per
    shape with each round's medians and the medians of the rounds' differences (`diff_ms_median`,
    off - on; `whole_ms_median`, next - on), which the cost model reads
    (`sims.profile_cost.ProfileCost.set_tile_pairs`): the fraction of a whole tile a partial one
    costs, measured on both sides."""
    out = []
    for d, edge in pairs:
        pm = min(chunk_tokens, cfg.max_num_batched_tokens - d)
        for p in (0, pm) if pm >= 1 else (0,):
            cs = (edge, edge + 1, edge + TILE_PAIR_EDGE)
            steps = {c: make_step(d, p, c, cfg.block_size, cfg.num_blocks, vocab) for c in cs}
            got: dict[int, list[float]] = {c: [] for c in cs}
            for r in range(rounds):
                for c in (cs if r % 2 == 0 else cs[::-1]):
                    ms = measure(runner, steps[c], repeats, 1 if r == 0 else 0, pause_s if p else 0.0)
                    got[c].append(statistics.median(ms))
            on, off, nxt = (got[c] for c in cs)
            rec = {"num_decode_seqs": d, "num_prefill_tokens": p, "num_prefill_seqs": 1 if p else 0,
                   "on_context": cs[0], "off_context": cs[1], "next_context": cs[2], "rounds": rounds,
                   "repeats": repeats, "on_ms": [round(x, 5) for x in on], "off_ms": [round(x, 5) for x in off],
                   "next_ms": [round(x, 5) for x in nxt], "on_ms_median": statistics.median(on),
                   "off_ms_median": statistics.median(off), "next_ms_median": statistics.median(nxt),
                   "diff_ms_median": statistics.median(b - a for a, b in zip(on, off)),
                   "whole_ms_median": statistics.median(b - a for a, b in zip(on, nxt)),
                   "sm_clock_mhz": sm_clock_mhz(runner.device)}
            out.append(rec)
            print(f"tile pair d={d:4d} p={p:5d} c={cs[0]}/{cs[1]}/{cs[2]}: {rec['on_ms_median']:9.3f} / "
                  f"{rec['off_ms_median']:9.3f} / {rec['next_ms_median']:9.3f} ms, off - on "
                  f"{rec['diff_ms_median']:+.4f} ms, next - on {rec['whole_ms_median']:+.4f} ms", flush=True)
    return out


def decode_attention_plan(buckets: Sequence[int], num_kv_heads: int, sm_count: int,
                          split_context_len: int, kv_cache_dtype: str = "auto") -> dict:
    """The paged-attention decode kernel's launch plan for a decode of each bucket's sequences,
    from the kernel's own sizing functions (`backend.kernels.paged_attention`): per bucket the
    context splits S it chooses at `split_context_len` (bucket x num_kv_heads programs a split)
    and the programs resident at once, R = resident programs per SM x `sm_count` for that launch.
    Quantized pages ("fp8", "int4-fp8") take the quantized decode's tiles and residency (or the
    register cap's, where `quant_decode_plan` caps the launch)."""
    from backend.kernels import paged_attention as pa
    from backend.kv.formats import FORMATS

    quant = kv_cache_dtype in FORMATS    # else model-dtype pages ("auto")
    block_n = pa.QUANT_BLOCK_N if quant else pa.BLOCK_N
    out = {}
    for b in sorted({int(x) for x in buckets if int(x) > 0}):
        programs = b * num_kv_heads
        entry = {}
        if quant:
            splits, cap = pa.quant_decode_plan(programs, split_context_len, sm_count, block_n,
                                               int4_keys=FORMATS[kv_cache_dtype][0] == "int4")
            per_sm = pa.QUANT_DECODE_RESIDENT_PER_SM if cap is None else 65536 // (cap * 128)
            if cap is not None:
                entry["maxnreg"] = cap
        else:
            splits = pa.choose_num_splits(programs, split_context_len, sm_count,
                                          pa.DECODE_RESIDENT_PER_SM, block_n)
            per_sm = pa.DECODE_RESIDENT_PER_SM
        out[str(b)] = {"splits": splits, "resident_programs": per_sm * sm_count, **entry}
    return {"num_kv_heads": num_kv_heads, "sm_count": sm_count, "kv_cache_dtype": kv_cache_dtype,
            "block_n": block_n, "split_context_len": split_context_len, "buckets": out}


def num_kv_heads(runner, loaded) -> int:
    """The kv heads a decode launch runs over: the KV pool's (this rank's, under tensor
    parallelism), else the model config's."""
    kv = getattr(runner, "kv", None)
    caches = getattr(kv, "k_caches", None)
    if caches:
        return int(caches[0].shape[2])
    return int(loaded.config.num_key_value_heads)


def runner_decode_attention(runner, cfg, num_kv_heads: int, grid_ds: Sequence[int]) -> dict:
    """`decode_attention_plan` for this runner: its decode graph buckets (eager: the grid's decode
    batches that fit), its KV format and kv heads, the device's SMs; the split context is
    max_model_len (what a decode graph passes; an eager decode passes its longest context, so
    there `cuda_graphs` is false and the plan is what graphs would run). `kernel`: what the
    runner's attention is ("triton"; "cpu" on the CPU, where the plan is still the Triton one,
    for the simulator's what-ifs; "torch" for the reference path on CUDA)."""
    from backend.kernels.dispatch import KernelAttention
    from backend.kernels.triton_utils import num_sms

    if isinstance(getattr(runner.model, "attn", None), KernelAttention):
        kernel = "triton"
    else:
        kernel = "cpu" if runner.device.type == "cpu" else "torch"
    graphs = runner.graphs is not None
    buckets = (list(runner.graphs.buckets) if graphs
               else [d for d in grid_ds if 0 < d <= cfg.max_num_seqs])
    kv_dtype = getattr(runner.kv, "kv_cache_dtype", "auto")
    plan = decode_attention_plan(buckets, num_kv_heads, num_sms(runner.device), cfg.max_model_len,
                                 kv_dtype)
    return {"kernel": kernel, "cuda_graphs": graphs, **plan}


# the block order check's decode batches (issue 35, session 21): on the H100's three 6.7B grid parts
# (bf16 twice, FP8) the live decode-only steps of near-equal contexts (max / mean <= 1.05) ran over
# the profile's device times at their shape by -0.5% at d 1, ~0.8% at 5-8, 1.0-1.3% at 9-16 and
# 1.4-2.0% at 17-64 (bench/results/fidelity_grid_h100_s21/analysis/decode_vs_profile.txt; the H200's
# 33B int4-fp8 KV part: ~1.00 to d 32, 1.01 at 33-64): an excess per sequence that the contiguous
# points do not have; live, each sequence's blocks are interleaved with the others' as they grow
BLOCK_ORDER_CHECK_DS = (16, 64, 128)
# the prefilled contexts only up to this batch: the fill is the check's cost (64 x 511 tokens, ~3 s on
# the 33B bf16, H200; 128 would double it and put the 33b part past its call)
BLOCK_ORDER_FILL_MAX_D = 64


def fill_decode_kv(runner, d: int, c: int, cfg, vocab: int) -> int:
    """Write the model's own K/V into what `make_step`'s contiguous d decodes of context c read: each
    decode's first c - 1 positions prefilled through its own block table, in launches within the
    token budget and the sequence limit (a prompt longer than the budget in pieces, in order, one
    piece of a sequence a launch). The grid's points read a zeroed pool. Returns the launches."""
    tables, _ = decode_tables([-(-c // cfg.block_size)] * d, cfg.num_blocks, "contiguous")
    n, budget = c - 1, cfg.max_num_batched_tokens
    pieces = [(i, s0, min(budget, n - s0)) for i in range(d) for s0 in range(0, n, budget)]
    launches, batch, used, seqs = 0, [], 0, set()

    def flush():
        nonlocal launches, batch, used, seqs
        if batch:
            runner.finish(runner.launch(batch))
            launches += 1
        batch, used, seqs = [], 0, set()

    for i, s0, m in pieces:
        if used + m > budget or len(batch) >= cfg.max_num_seqs or i in seqs:
            flush()
        ids = [(13 * j + 5 + i) % vocab for j in range(s0, s0 + m)]
        batch.append(_chunk(f"f{i}", ids, s0, tables[i], True))
        used += m
        seqs.add(i)
    flush()
    if runner.device.type == "cuda":
        torch.cuda.synchronize()
    return launches


def block_order_check(runner, ds: Sequence[int], c: int, cfg, vocab: int, repeats: int, warmup: int,
                      device_time: bool, kv_fill: str = "zeros") -> list[dict]:
    """Each decode batch in `ds` at context c in every block order (`decode_tables`) over the
    pool the grid's points read (`kv_content` its `kv_fill`: "random" or "zeros"); after a random
    fill, each contiguous once more over the pool zeroed (`kv_content` "zeros": the fill's effect
    at the shape, session 29); then (those up to BLOCK_ORDER_FILL_MAX_D) in the contiguous
    order once more after the largest such batch's contexts were prefilled (`fill_decode_kv`: the
    K/V a live decode reads, which the zeros' power does not have), timed as the grid's decode points (back to back; device-timed
    with `device_time`): one record each, `kv_content` "random", "zeros" or "prefilled". Run after every
    other measurement: the prefill leaves the pool's first blocks written."""
    out = []

    def one(d: int, order: str, content: str) -> None:
        chunks = make_step(d, 0, c, cfg.block_size, cfg.num_blocks, vocab, block_order=order)
        ms = measure(runner, chunks, repeats, warmup)
        dev = measure_device(runner, chunks, repeats) if device_time else None
        rec = {"num_decode_seqs": d, "context_len": c, "block_order": order, "kv_content": content,
               "step_ms_median": statistics.median(ms)}
        if dev:
            rec["device_ms_median"] = statistics.median(dev)
        out.append(rec)
        print(f"block order check d={d:4d} c={c:6d} {order:11s} {content:9s} {rec['step_ms_median']:9.3f} ms"
              + (f"  device {rec['device_ms_median']:9.3f} ms" if dev else ""), flush=True)

    for d in ds:
        for order in BLOCK_ORDERS:
            one(d, order, kv_fill)
    if kv_fill == "random":
        fill_kv_pool(runner, "zeros")
        for d in ds:
            one(d, "contiguous", "zeros")
    filled = [d for d in ds if d <= BLOCK_ORDER_FILL_MAX_D]
    if filled:
        fill_decode_kv(runner, max(filled), c, cfg, vocab)
        for d in filled:
            one(d, "contiguous", "prefilled")
    return out


def measure(runner, chunks, repeats: int, warmup: int, pause_s: float = 0.0,
            launch_ms: list[float] | None = None, busy_chunks=None) -> list[float]:
    """Wall milliseconds of each timed repetition (host launch + device, synchronized).
    `launch_ms` (if given) also gets the host's part of each: `runner.launch` until it returns
    (inputs filled, graph queued), which the serving loop overlaps with the step before.
    `busy_chunks`: the `pause_s` before each repetition runs these steps back to back instead of
    idling (the pause check's "after_decode" run)."""
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    times = []
    for i in range(warmup + repeats):
        sync()
        if pause_s > 0 and busy_chunks is not None:
            until = time.perf_counter() + pause_s
            while time.perf_counter() < until:
                runner.finish(runner.launch(busy_chunks))
            sync()
        elif pause_s > 0:
            time.sleep(pause_s)
        t0 = time.perf_counter()
        step = runner.launch(chunks)
        t1 = time.perf_counter()
        runner.finish(step)
        sync()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1000)
            if launch_ms is not None:
                launch_ms.append((t1 - t0) * 1000)
    return times


# the spin before a device-timed repetition (`measure_device`): longer than any step's host launch
# (the H200's were 0.2-2.8 ms), so that the step's ops are all queued when the device reaches them
DEVICE_QUEUE_S = 0.005


def measure_device(runner, chunks, repeats: int, pause_s: float = 0.0,
                   queue_s: float = DEVICE_QUEUE_S) -> list[float] | None:
    """Device milliseconds of each of `repeats` repetitions run as the serving loop runs a step:
    after the `pause_s` (as `measure`), a spin kernel of `queue_s` holds the stream while the host
    launches the step, so its start event (recorded before its input copies) fires once the spin
    ends and the step's own ops run back to back to its read-back, as behind a step in flight;
    the CUDA events are the live step log's (`ModelRunner.buffers.device_seconds`). None where the
    step is not timed (the CPU, a step without a read-back)."""
    if runner.device.type != "cuda" or not hasattr(torch.cuda, "_sleep"):
        return None
    clock = sm_clock_mhz(runner.device) or 2000
    cycles = int(queue_s * clock * 1e6)
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        if pause_s > 0:
            time.sleep(pause_s)
        torch.cuda._sleep(cycles)
        step = runner.launch(chunks)
        runner.finish(step)
        torch.cuda.synchronize()
        if getattr(step, "readback", -1) < 0:
            return None
        dev = runner.buffers.device_seconds(step.readback)
        if dev is None:
            return None
        out.append(dev * 1000)
    return out


# Issue 35, session 32: the grid's decode points each follow the grid's paused mixed points, but the
# decode-bucket points (and the spread points) came one decode shape after another at the end. On one
# H100 (6.7B FP8) that alone read them 1-1.7 % under the same shapes run after a paused mixed step, after
# idle, or over blocks not just read (bench/results/decode_same_machine_s32/bucket_pass_check.log), and
# the live steps priced by them ran 1.8 % over the model where the grid's points' steps ran 1.000 (its
# read_by_pass.txt). A served decode step does not follow dozens of copies of itself, so every
# decode-only point is measured as the grid's are: after the mixed step.
# One run: what precedes the point is then what precedes a grid decode point, a paused mixed step (the check
# ran three; one keeps the 33B's ~66 conditioned points at ~+15 s a profile instead of ~+40).
CONDITION_REPEATS = 1


def condition_decode_point(runner, d: int, c: int, prefill_tokens: Sequence[int], cfg, vocab: int,
                           pause_s: float) -> int:
    """Run the grid's mixed step beside a decode-only point's d decodes of context c (the grid's
    largest prefill that fits beside them), `CONDITION_REPEATS` times, each after `pause_s` idle as
    the grid times its mixed points; untimed. 1 if it ran, 0 where no prefill fits beside d."""
    fit = [x for x in prefill_tokens
           if x > 0 and d + x <= cfg.max_num_batched_tokens and d + 1 <= cfg.max_num_seqs
           and max(c, x) <= cfg.max_model_len]
    if not fit:
        return 0
    chunks = make_step(d, max(fit), c, cfg.block_size, cfg.num_blocks, vocab, 1, 0)
    measure(runner, chunks, CONDITION_REPEATS, 0, pause_s)
    return 1


def sm_clock_mhz(device) -> int | None:
    """The SM clock now (NVML through torch), or None where it cannot be read."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.clock_rate(device))
    except Exception:  # noqa: BLE001 -- no NVML on this machine: the profile goes on without it
        return None


def power_w(device) -> float | None:
    """The board's power draw now in W (NVML through torch), or None where it cannot be read."""
    if device.type != "cuda":
        return None
    try:
        return round(torch.cuda.power_draw(device) / 1000, 1)
    except Exception:  # noqa: BLE001 -- no NVML on this machine: the profile goes on without it
        return None


# the pause check's "sustained" run: this long of the step back to back, every step timed (the
# trace), after SUSTAIN_IDLE_S idle, then its timed repetitions (issue 35, sessions 14-15): the
# "back_to_back" run's ten repetitions last 10 x the step, 0.5 s on the 33B but 0.14 s on the 6.7B
# (63 ms in session 14, whose check ran a 64-token step), shorter than the power limiter's
# response; live the 6.7B's steps with prefill under sustained load ran 6% over the model at
# 1,905 MHz / 678 W (1,980 MHz idle). The trace gives the level the clock settles at and how fast
# (sims.profile_cost.fit_sustained_trace). Live the 6.7B's SM clock followed an exponential average
# of the prefill-busy time with tau ~0.5 s (0.3-0.75 s alike; bench/results/fidelity_cost_s15,
# clock_tau.py): 2.5 s settles a tau up to ~0.8 s (the fit extrapolates nothing past tau = span / 3);
# ~180 steps of the 6.7B's 512-token prefill, ~49 of the 33B's. The idle before lets the average
# fall to e^-1 of where the after_decode run left it (the fit's level A is free: any start works).
SUSTAIN_S = 2.5
SUSTAIN_IDLE_S = 0.5
# the step the pause check times: the prefill-only point of this many tokens (or the largest below
# it): compute-bound, as the steps the power cap slows. The first prefill-only point had been taken,
# which the capped engine's grid (64-token chunks first, 2026-12-04) made a 64-token step: 6.3 ms
# on the 6.7B, mostly the weights' read, which draws too little power to see the cap
PAUSE_CHECK_TOKENS = 512
# the SM clock is read every this many steps of the trace (an NVML call each)
TRACE_CLOCK_EVERY = 8
# the pause check's "sustained_mixed" run (issue 35, session 16): the step the capped engine runs
# under load, one chunk of this many prefill tokens beside MIXED_DECODES decodes of the grid's middle
# decode context, paused (`pause_ms` before each) and then traced back to back as "sustained". Live
# on the H200 the power limiter throttled such steps far less than the 512-token prefill-only step
# (33B FP8: SM clock 1,800 MHz at a full prefill-busy share against 1,605 for the sustained
# prefill-only run, the live steps 0.99 x the paused profile against its 1.12): the power a step
# draws depends on its kind, which the cost model takes from this run
# (sims.profile_cost, "Power by step kind"; bench/results/fidelity_cost_s16)
MIXED_CHUNK = 256
MIXED_DECODES = 32
# the pause check's "sustained_packed" run (issue 35, session 18): the grid's largest prefill-only
# step (`packed_check_shape`: 2,048 tokens in 4 prompts on the validate's grids), paused then traced
# back to back as "sustained_mixed". Live on the H200 the ~2,000-token packed steps draw the most
# power of any step (33B FP8: SM clock 1,642 MHz median inside them against 1,860 in the mixed
# steps, the SW cap flag in every sample; bench/results/fidelity_packed_s18), and without this run
# their weight in the cap is extrapolated from the 512-token and the mixed steps by token rate
# (held at the 512-token step's). (The 6.7B FP8's, charged 0.86-0.95 of live, ran at 1,965 MHz:
# their error is their shape, not the cap, which this run does not measure.) Its device time:
# `repeats` + 1 paused steps, SUSTAIN_IDLE_S and SUSTAIN_S: ~4 s on the 6.7B (2,048-token step
# 28-42 ms), ~5 s on the 33B FP8 (127 ms), ~6 s on the 33B bf16 (207 ms); its back-to-back figures
# are the trace's last steps (no repetitions after it: the trace's tail is that state already).


# the pause check's "mixed_pattern_<n>" runs (issue 35, session 20): the "sustained_mixed" step with n
# decode-only steps of its decodes between (the capped engine's pattern under load: a chunk, then
# decodes while the next prompt waits for its window), after SUSTAIN_IDLE_S idle and for PATTERN_S
# back to back, every step timed; the mixed and the decode steps' medians over the run's second half
# beside their paused (mixed) and back-to-back (decode, as the grid's decode points) references. Why:
# on the H200's session-20 parts the live steps with a 129-256-token chunk beside 1-32 decodes ran
# 5-8% over the paused profile at their shape (33B int4-fp8 KV: the model 0.93-0.95 of live), the SM
# clock inside them at 1,650-1,700 MHz though the prefill share before them was only 0.34-0.39: the
# decode spells between them leave the power limiter no headroom (sims.profile_cost, "Decode spells").
# Neither the paused points nor the sustained runs hold that pattern; these runs check the term's
# premise on the device (recorded, not read by the model yet). Device time: ~1.5 s a run.
PATTERN_DECODES_BETWEEN = (1, 3)
PATTERN_S = 1.0


def mixed_pattern(runner, mixed, decode, n: int, span_s: float, idle_s: float, repeats: int) -> dict:
    """`idle_s` idle, then for `span_s` the step `mixed` with `n` steps `decode` after each, back to
    back, every step timed (start ms since the first's, wall ms as `measure`; on CUDA also its
    device ms, the live step log's events): the pattern's record and its mixed / decode steps'
    medians over the second half (the state the pattern settles at)."""
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    decode_alone = measure(runner, decode, repeats, 1, 0.0)
    sync()
    time.sleep(idle_s)
    t_first = time.perf_counter()
    t_end = t_first + span_s
    starts, ms, kinds, dev = [], [], [], []
    while time.perf_counter() < t_end or not ms:
        for kind, chunks in [("m", mixed)] + [("d", decode)] * n:
            t0 = time.perf_counter()
            step = runner.launch(chunks)
            runner.finish(step)
            sync()
            t1 = time.perf_counter()
            starts.append(round((t0 - t_first) * 1000, 3))
            ms.append(round((t1 - t0) * 1000, 4))
            kinds.append(kind)
            dev.append(_step_device_ms(runner, step))
    half = starts[-1] / 2

    def late(kind: str, xs=ms) -> list[float]:  # the kind's steps of the second half (all, where none)
        return ([x for x, k, t in zip(xs, kinds, starts, strict=True) if k == kind and t >= half]
                or [x for x, k in zip(xs, kinds, strict=True) if k == kind])

    late_m, late_d = late("m"), late("d")
    timed = None not in dev
    piped = _pipelined_pattern(runner, mixed, decode, n, span_s) if timed else {}
    return {**({"device_ms_median": statistics.median(late("m", dev)),
                "decode_device_ms_median": statistics.median(late("d", dev)),
                "pattern_device_ms": dev} if timed else {}), **piped,
            "decode_steps_between": n, "step_ms_median": statistics.median(late_m),
            "step_ms_min": min(late_m), "step_ms_max": max(late_m),
            "decode_ms_median": statistics.median(late_d),
            "decode_alone_ms_median": statistics.median(decode_alone),
            "sustain_ms": span_s * 1000, "idle_before_ms": idle_s * 1000, "pattern_steps": len(ms),
            "pattern_t_ms": starts, "pattern_ms": ms, "pattern_kinds": "".join(kinds)}


def _pipelined_pattern(runner, mixed, decode, n: int, span_s: float) -> dict:
    """The pattern again, launched as the serving loop launches (`_pipelined`), each step's device
    ms (its ops all queued when the device reaches them, as live). The synchronous pattern's device
    window also holds the host's input preparation, which the device waits through (session 27's
    first H100 call: +0.4 ms a mixed step); this one holds only the step. Medians over the second
    half."""
    seen = _pipelined(runner, [("m", mixed)] + [("d", decode)] * n, span_s)
    if not seen or "m" not in {k for k, _ in seen}:
        return {}
    kinds, dev = "".join(k for k, _ in seen), [ms for _, ms in seen]
    half = len(dev) // 2

    def late(kind: str) -> list[float]:
        return [x for x, k in zip(dev[half:], kinds[half:], strict=True) if k == kind] or \
            [x for x, k in zip(dev, kinds, strict=True) if k == kind]

    return {"pipelined_device_ms_median": statistics.median(late("m")),
            **({"pipelined_decode_device_ms_median": statistics.median(late("d"))} if "d" in kinds else {}),
            "pipelined_kinds": kinds, "pipelined_device_ms": dev}


# the "stream_mixed" run's shapes: the grid's one-chunk mixed points (decodes beside a chunk from
# position 0), at most this many, spread over the grid's (d, p)
STREAM_SHAPES = 12
# ... and how long it runs, after how long idle, timed in bins of STREAM_BIN_S (issue 35, session 28).
# Session 27's H100 calls found live mixed steps 1.5-3% over the paused profile, growing over seconds
# of load (a 7 s replay pass of live steps: 1.010 -> 1.017 -> 1.033 x paused) while the SM clock sat
# 1.2% (H100) / 2.2-2.4% (H200) under the paused points' under the SW power cap: the limiter's slow
# sag, past the sustained runs' 2.5 s (their fits read a tau of ~0.3 s and stop). The span resolves a
# time constant up to ~2 s in 6 s; the idle before lets a sag that slow relax from the runs before it. The
# steps of each bin run two in flight (as the serving loop), the pipeline drained between bins
# (one step's host time a second) to read the clock and the board power. Measured on the H100 6.7B
# (bench/results/fidelity_sag_s28): flat, 1.001-1.004 by second (1.034-1.042 with heavier shapes), the
# limiter at its level within the first second; kept for the H200, whose cap acts harder, at 6 s after
# 2 s idle (12 s after 3 s as first built: the 33B's grid parts must stay inside the device call).
STREAM_S = 6.0
STREAM_IDLE_S = 2.0
STREAM_BIN_S = 1.0
# ... and, in the long form, two more shapes: the pause check's mixed step with its chunk after a cached
# prefix of these many tokens (where the model's length allows). Why: on the H100 6.7B mixed part's live
# steps replayed (session 27, call 3) a chunk after a prefix > 1,024 ran 1.054-1.076 x its paused time in
# the stream, one from 0 1.011; whether a busy engine's long-prefix chunks run slower at full clock, or
# throttle (the clock in the bins tells), is what their own pipelined / paused medians say. Answered on
# the H100 6.7B (1.000 / 1.002 in the stream, 1.004 alone: not slower; fidelity_sag_s28), so none by
# default now (`stream_mixed(prefix_starts=...)` keeps the form)
STREAM_PREFIX_STARTS: tuple[int, ...] = ()


def stream_mixed(runner, shapes, cfg, vocab: int, pause_s: float, repeats: int, span_s: float,
                 idle_s: float = 0.0, bin_s: float | None = None, prefix_starts=()) -> dict | None:
    """The pause check's "stream_mixed" run (issue 35, session 27): up to STREAM_SHAPES of the grid's
    one-chunk mixed shapes, each timed paused as the grid's points (`measure_device`), then, after
    `idle_s` idle, run in turn for `span_s`, each launched while the one before runs (two in flight,
    as the serving loop), each step's device time read from its events. Live on an H100, a replayed
    live step with prefill after another ran 1.4% over the same step paused, where one repeated
    synthetic step ran 1.000 (bench/results/fidelity_onset_s27, call 3 against call 2): a busy
    engine's steps with prefill differ step to step. `bin_s` (session 28): the span in bins of that
    long, the pipeline drained between them, each bin's ratio (its steps' device time over their
    shapes' paused) with the SM clock and board power after it: how the stream slows over seconds
    (`sims.profile_cost.fit_stream_sag`). `prefix_starts`: with them, the mixed step of
    MIXED_DECODES decodes beside a MIXED_CHUNK chunk after each such prefix joins the shapes (listed
    as (d, p, c, s); STREAM_PREFIX_STARTS). {"run", "shapes": [(d, p, c)], "paused_device_ms",
    "pipelined_device_ms" (medians a shape over the second half), "ratio" (their totals' ratio),
    with `bin_s` "bins": [{"t_s" (the bin's start), "ratio", "steps", "sm_clock_mhz", "power_w"}]}
    or None (no device timing, fewer than two such shapes)."""
    mixed = sorted({(d, p, c) for d, p, c, k, s in shapes if d and p and k == 1 and s == 0})
    if len(mixed) < 2 or runner.device.type != "cuda":
        return None
    if len(mixed) > STREAM_SHAPES:
        mixed = [mixed[round(i * (len(mixed) - 1) / (STREAM_SHAPES - 1))] for i in range(STREAM_SHAPES)]
    mixed = [(d, p, c, 0) for d, p, c in mixed]
    if prefix_starts:
        top = cfg.max_model_len
        dm = max(1, min(MIXED_DECODES, cfg.max_num_seqs - 2))
        pm = max(1, min(MIXED_CHUNK, cfg.max_num_batched_tokens - dm))
        c_mid = sorted(c for _, _, c, _ in mixed)[len(mixed) // 2]
        mixed += [(dm, pm, c_mid, st) for st in prefix_starts if st + pm <= top and c_mid <= top]
    steps = [make_step(d, p, c, cfg.block_size, cfg.num_blocks, vocab, 1, st) for d, p, c, st in mixed]
    paused = []
    for chunks in steps:
        dev = measure_device(runner, chunks, repeats, pause_s)
        if not dev:
            return None
        paused.append(statistics.median(dev))
    # a fixed order that changes shape every step (the shapes interleaved from both ends)
    order = [i for pair in zip(range(len(steps)), reversed(range(len(steps)))) for i in pair][:len(steps)]
    torch.cuda.synchronize()
    if idle_s > 0:
        time.sleep(idle_s)
    seen, bins = [], []
    n_bins = max(1, round(span_s / bin_s)) if bin_s else 1
    t0 = time.perf_counter()
    k = 0  # where in the order the next bin starts: where the bin before stopped
    for b in range(n_bins):
        rot = order[k:] + order[:k]
        got = _pipelined(runner, [(str(i), steps[i]) for i in rot], bin_s if bin_s else span_s)
        if not got:
            return None
        seen.extend(got)
        k = (k + len(got) + 1) % len(order)  # its first step (from idle) launched, not kept
        if bin_s:
            dev = sum(ms for _, ms in got)
            bins.append({"t_s": round(b * bin_s, 3), "ratio": round(dev / sum(paused[int(lb)] for lb, _ in got), 5),
                         "steps": len(got), "sm_clock_mhz": sm_clock_mhz(runner.device),
                         "power_w": power_w(runner.device)})
    half = seen[len(seen) // 2:]
    piped = []
    for i in range(len(steps)):
        xs = [ms for label, ms in half if label == str(i)] or [ms for label, ms in seen if label == str(i)]
        if not xs:
            return None
        piped.append(statistics.median(xs))
    return {"run": "stream_mixed", "pause_ms": 0.0, "paused_pause_ms": pause_s * 1000,
            "shapes": [list(x) if x[3] else list(x[:3]) for x in mixed], "paused_device_ms": paused,
            "pipelined_device_ms": piped,
            "ratio": sum(piped) / sum(paused), "steps": len(seen), "sm_clock_mhz": sm_clock_mhz(runner.device),
            **({"idle_before_ms": idle_s * 1000, "span_s": round(time.perf_counter() - t0, 3), "bin_s": bin_s,
                "bins": bins} if bin_s else {})}


class NvmlSampler:
    """NVML every SAMPLE_EVERY_S from a thread while a stream runs (a clock read between steps is an
    idle engine's): the SM clock, the board power, and whether the SW power cap (reason 0x4) or a
    HW slowdown (0x8 | 0x40 | 0x80) throttled. Inert where NVML is missing (the CPU, no pynvml)."""

    SAMPLE_EVERY_S = 0.02

    def __init__(self, device):
        self.nv = None
        if device.type == "cuda":
            try:
                import pynvml
                pynvml.nvmlInit()
                self.nv = pynvml
                self.h = pynvml.nvmlDeviceGetHandleByIndex(device.index if device.index is not None
                                                           else torch.cuda.current_device())
            except Exception:  # noqa: BLE001 -- no NVML: no samples
                self.nv = None
        self.rows: list[tuple[float, int, float, int, int]] = []
        self._stop = threading.Event()
        self._thread = None

    def _run(self) -> None:
        nv, h, t0 = self.nv, self.h, time.perf_counter()
        while not self._stop.is_set():
            try:
                why = nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)
                self.rows.append((round(time.perf_counter() - t0, 3), nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                                  round(nv.nvmlDeviceGetPowerUsage(h) / 1000, 1), int(bool(why & 0x4)),
                                  int(bool(why & 0xC8))))
            except Exception:  # noqa: BLE001 -- a failed read ends the samples, not the profile
                return
            time.sleep(self.SAMPLE_EVERY_S)

    def __enter__(self):
        if self.nv is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict:
        """Medians over the samples past the first third (the stream's settled state); {} without."""
        if not self.rows:
            return {}
        late = self.rows[len(self.rows) // 3:]
        return {"samples": len(self.rows), "sm_clock_median": statistics.median(r[1] for r in late),
                "power_median_w": statistics.median(r[2] for r in late),
                "sw_power_cap_share": round(sum(r[3] for r in late) / len(late), 3),
                "hw_slowdown_share": round(sum(r[4] for r in late) / len(late), 3)}


# the pause check's "stream_kind" runs (issue 35, session 28): each of its step kinds alone, paused
# (as the grid's points) and then STREAM_KIND_S back to back two in flight after STREAM_KIND_IDLE_S,
# in device time, with NVML sampled during it. Why: on the H100 the 6.7B's busy streams ran with the SW
# power cap set in 99-100% of samples, each kind throttled by its own power (the grid's mixed steps
# 1.008-1.017 x paused at 1,920 MHz, a decode-heavy one 1.002 at 1,965, the 2,048-token packed step
# 1.13 at 1,560; bench/results/fidelity_sag_s28), within the first second. The power-by-kind cap's
# anchors (sims.profile_cost) come from the sustained runs' WALL times, launched one at a time, whose
# paused runs pay an idle host's launch too: on the H200 6.7B the mixed step read 0.955 back to back
# against paused in wall time while its live steps ran ~3% over the paused device times. These runs
# give each kind's throttle in the device time the model is fitted in (the H100's kinds reached their level
# within the first second). ~2.5 s a kind, ~3.3 s the 33B's packed step: its paused reference from
# STREAM_KIND_REPEATS steps.
STREAM_KIND_S = 1.5
STREAM_KIND_IDLE_S = 0.5
STREAM_KIND_REPEATS = 5


def stream_kind(runner, name: str, chunks, pause_s: float, repeats: int, span_s: float = STREAM_KIND_S,
                idle_s: float = STREAM_KIND_IDLE_S) -> dict | None:
    """One "stream_kind" run (the comment above): {"run", "kind", "paused_device_ms_median",
    "pipelined_device_ms_median" (the second half), "ratio", "steps", "nvml" (`NvmlSampler.summary`)},
    or None (no device timing: the CPU)."""
    paused = measure_device(runner, chunks, min(repeats, STREAM_KIND_REPEATS), pause_s)
    if not paused:
        return None
    torch.cuda.synchronize()
    time.sleep(idle_s)
    with NvmlSampler(runner.device) as smi:
        seen = _pipelined(runner, [(name, chunks)], span_s)
    if not seen:
        return None
    late = [ms for _, ms in seen[len(seen) // 2:]]
    base, piped = statistics.median(paused), statistics.median(late)
    return {"run": "stream_kind", "kind": name, "pause_ms": 0.0, "paused_pause_ms": pause_s * 1000,
            "paused_device_ms_median": base, "pipelined_device_ms_median": piped, "ratio": piped / base,
            "steps": len(seen), "span_s": span_s, "idle_before_ms": idle_s * 1000, "nvml": smi.summary()}


def launch_pipelined(runner, order: list, span_s: float | None = None) -> list[tuple[str, float | None, float]]:
    """`order` [(label, chunks)] launched as the serving loop launches: each step while the one before
    runs, then that one finished (two in flight, never three, so no step's inputs are rewritten
    before they are copied). `span_s`: through `order` in turn for that long; None: one pass. Each
    step's (label, device ms (None without timing events: the CPU), wall ms from its launch to its
    finish), the first (launched from idle) included."""
    cuda = runner.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    out = []
    t_end = None if span_s is None else time.perf_counter() + span_s
    i, n = 0, len(order)
    prev_label, t_prev = order[0][0], time.perf_counter()
    prev = runner.launch(order[0][1])
    while (i + 1 < n) if t_end is None else (time.perf_counter() < t_end):
        i += 1
        label, chunks = order[i % n]
        t_cur = time.perf_counter()
        cur = runner.launch(chunks)
        runner.finish(prev)
        out.append((prev_label, _step_device_ms(runner, prev), (time.perf_counter() - t_prev) * 1000))
        prev_label, prev, t_prev = label, cur, t_cur
    runner.finish(prev)
    out.append((prev_label, _step_device_ms(runner, prev), (time.perf_counter() - t_prev) * 1000))
    if cuda:
        torch.cuda.synchronize()
    return out


def _pipelined(runner, order: list, span_s: float) -> list[tuple[str, float]] | None:
    """`launch_pipelined` for `span_s`: each step's (label, device ms), the first left out; None
    without timing events."""
    rows = launch_pipelined(runner, order, span_s)[1:]
    return None if any(dev is None for _, dev, _ in rows) else [(label, dev) for label, dev, _ in rows]


def _step_device_ms(runner, step) -> float | None:
    """A finished step's device ms (the live step log's CUDA events: its start, before its input
    copies, to its read-back), or None (the CPU, a step without a read-back)."""
    if runner.device.type != "cuda" or getattr(step, "readback", -1) < 0:
        return None
    sec = runner.buffers.device_seconds(step.readback)
    return None if sec is None else round(sec * 1000, 4)


def sustained_trace(runner, chunks, sustain_s: float, idle_s: float) -> dict:
    """`idle_s` idle, then the step back to back for `sustain_s`, each step timed: its start
    (ms since the first's) and wall time (launch to tokens read back, as `measure`), the SM clock
    every TRACE_CLOCK_EVERY steps. The pause check's "sustained" run's record (the module doc of
    sims.profile_cost fits it)."""
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    sync()
    time.sleep(idle_s)
    t_first = time.perf_counter()
    t_end = t_first + sustain_s
    starts, ms, clocks, power, dev = [], [], [], [], []
    while True:
        t0 = time.perf_counter()
        if t0 >= t_end:
            break
        if not ms:
            t_first = t0  # the trace's times from the first step's start
        step = runner.launch(chunks)
        runner.finish(step)
        sync()
        t1 = time.perf_counter()
        starts.append(round((t0 - t_first) * 1000, 3))
        ms.append(round((t1 - t0) * 1000, 4))
        dev.append(_step_device_ms(runner, step))
        if len(ms) % TRACE_CLOCK_EVERY == 1:
            clk = sm_clock_mhz(runner.device)
            if clk is not None:
                clocks.append([starts[-1], clk])
            pw = power_w(runner.device)
            if pw is not None:
                power.append([starts[-1], pw])
    doc = {"sustain_ms": sustain_s * 1000, "sustain_steps": len(ms), "idle_before_ms": idle_s * 1000,
           "trace_t_ms": starts, "trace_ms": ms, **({"trace_device_ms": dev} if None not in dev else {})}
    if clocks:
        doc["trace_sm_clock_mhz"] = clocks
    if power:
        doc["trace_power_w"] = power
    from sims.profile_cost import fit_sustained_trace
    fit = fit_sustained_trace([x / 1000 for x in starts], ms)
    if fit is not None:
        doc["trace_fit"] = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in fit.items()}
    return doc


def packed_check_shape(shapes, check_tokens: int) -> tuple[int, int, int, int, int] | None:
    """The "sustained_packed" run's step: the grid's prefill-only point (no decodes, from
    position 0, not a verify) of the most prefill tokens, of those the one of the most prompts
    (the engine packs several short prompts into its largest steps: live 4-5); None where the grid
    has no prefill-only point of more tokens than the pause check's step (`check_tokens`): the run
    would repeat that step (or one of its token rate) and add nothing the "sustained" run lacks."""
    cands = [x for x in shapes if x[0] == 0 and x[1] > check_tokens and x[4] == 0]
    return max(cands, key=lambda x: (x[1], x[3])) if cands else None


def compare_pause(runner, shapes, cfg, vocab: int, pause_s: float, repeats: int = 10,
                  sustain_s: float | None = None) -> dict | None:
    """A prefill-only point of the grid (one chunk of PAUSE_CHECK_TOKENS, or the largest below;
    else the smallest) again, paused / back to back / paused / after decodes,
    `repeats` each: how much of a compute-bound step's time the idle before it changes, in the
    same process (so a profile says what its --pause-ms did). "after_decode" fills the pause with
    decode steps of a middle decode batch of the grid instead of idling: the serving loop's prefill
    steps follow decode steps, not idle time (issue 35: on the H200 such steps ran ~3% over the
    paused profile with no prefill in the 100 ms before them). "sustained" (with `sustain_s` > 0,
    last): after SUSTAIN_IDLE_S idle, the step back to back for `sustain_s`, every step timed
    (`sustained_trace`: the trace and its fit), then its timed repetitions back to back: the
    clock a long busy period settles at, and how fast, whatever the step's length. Then (with
    `sustain_s` > 0) "sustained_mixed" (the capped engine's mixed step) and "sustained_packed" (the
    grid's largest prefill-only step, `packed_check_shape`; skipped, with the reason under
    "sustained_packed_skipped", where the grid has none larger than the check's step): each
    paused, then traced back to back (`sustained_trace`); after "sustained_mixed", "mixed_pattern_<n>"
    for n in PATTERN_DECODES_BETWEEN (its step with n decode steps between, `mixed_pattern`)."""
    cands = [(d, p, c, k, s) for d, p, c, k, s in shapes if d == 0 and p and k == 1 and s == 0]
    if not cands:
        return None
    below = [x for x in cands if x[1] <= PAUSE_CHECK_TOKENS]
    shape = max(below, key=lambda x: x[1]) if below else min(cands, key=lambda x: x[1])
    d, p, c, k, s = shape
    chunks = make_step(d, p, c, cfg.block_size, cfg.num_blocks, vocab, k, s)
    # a middle decode batch of the grid (its median; 16 of 1..256): the serving loop's decode
    # steps draw the power of a typical batch, not of the largest (33B at 0.8-0.95x: 10-35)
    decs = sorted({(dd, cc) for dd, pp, cc, _, _ in shapes if dd and not pp})
    dec = decs[(len(decs) - 1) // 2] if decs else None
    busy = None if dec is None else make_step(dec[0], 0, dec[1], cfg.block_size, cfg.num_blocks, vocab)
    plan = [("paused", pause_s, None), ("back_to_back", 0.0, None), ("paused_again", pause_s, None)]
    if busy is not None:
        plan.append(("after_decode", pause_s, busy))
    sustain_s = SUSTAIN_S if sustain_s is None else sustain_s
    if sustain_s > 0:
        plan.append(("sustained", 0.0, None))
    runs = []
    for label, pause, before in plan:
        extra = {}
        if label == "sustained":
            extra = sustained_trace(runner, chunks, sustain_s, SUSTAIN_IDLE_S)
        ms = measure(runner, chunks, repeats, 1, pause, busy_chunks=before)
        runs.append({"run": label, "pause_ms": pause * 1000, "step_ms_median": statistics.median(ms),
                     "step_ms_min": min(ms), "step_ms_max": max(ms),
                     "sm_clock_mhz": sm_clock_mhz(runner.device),
                     **({"decode_seqs_before": dec[0]} if before is not None else {}), **extra})
        print(f"pause check d=0 p={p}: {label:12s} median {runs[-1]['step_ms_median']:9.3f} ms", flush=True)
    if sustain_s > 0 and dec is not None:
        # "sustained_mixed": the capped engine's mixed step, paused, then traced back to back
        dm = max(1, min(MIXED_DECODES, cfg.max_num_seqs - 1))
        pm = max(1, min(MIXED_CHUNK, cfg.max_num_batched_tokens - dm))
        mixed = make_step(dm, pm, dec[1], cfg.block_size, cfg.num_blocks, vocab)
        paused = measure(runner, mixed, repeats, 1, pause_s)
        # its device time paused, as the grid's points time theirs (None on the CPU): against the
        # patterns' device times below, whether the step itself runs longer back to back
        paused_dev = measure_device(runner, mixed, repeats, pause_s)
        dev_extra = {"paused_device_ms_median": statistics.median(paused_dev)} if paused_dev else {}
        spin_dev = measure_device(runner, mixed, repeats, 0.0) if paused_dev else None
        if spin_dev:  # no pause, only the spin that queues the step: the pause's own share
            dev_extra["spin_device_ms_median"] = statistics.median(spin_dev)
            # each repetition too (session 40): their ratio is the busy level (sims.profile_cost, "The busy
            # level"), read from five repetitions a side; the two 33B bf16 profiles read 1.041 and 1.048
            dev_extra["paused_device_ms"] = [round(x, 4) for x in paused_dev]
            dev_extra["spin_device_ms"] = [round(x, 4) for x in spin_dev]
        extra = sustained_trace(runner, mixed, sustain_s, SUSTAIN_IDLE_S)
        ms = measure(runner, mixed, repeats, 1, 0.0)
        runs.append({"run": "sustained_mixed", "pause_ms": 0.0, "num_decode_seqs": dm, "num_prefill_tokens": pm,
                     "decode_context_len": dec[1], "paused_ms_median": statistics.median(paused),
                     "paused_pause_ms": pause_s * 1000, **dev_extra, "step_ms_median": statistics.median(ms),
                     "step_ms_min": min(ms), "step_ms_max": max(ms), "sm_clock_mhz": sm_clock_mhz(runner.device),
                     **extra})
        print(f"pause check d={dm} p={pm}: sustained_mixed paused {runs[-1]['paused_ms_median']:9.3f} ms, "
              f"back to back {runs[-1]['step_ms_median']:9.3f} ms", flush=True)
        # "mixed_pattern_<n>": the same step with n decode-only steps of its decodes between
        decode = make_step(dm, 0, dec[1], cfg.block_size, cfg.num_blocks, vocab)
        for n in PATTERN_DECODES_BETWEEN:
            pat = mixed_pattern(runner, mixed, decode, n, min(PATTERN_S, sustain_s), SUSTAIN_IDLE_S, repeats)
            runs.append({"run": f"mixed_pattern_{n}", "pause_ms": 0.0, "num_decode_seqs": dm,
                         "num_prefill_tokens": pm, "decode_context_len": dec[1],
                         "paused_ms_median": statistics.median(paused), "paused_pause_ms": pause_s * 1000,
                         **dev_extra, "sm_clock_mhz": sm_clock_mhz(runner.device), **pat})
            print(f"pause check d={dm} p={pm}: mixed_pattern_{n} mixed {pat['step_ms_median']:9.3f} ms "
                  f"(paused {runs[-1]['paused_ms_median']:9.3f}), decode {pat['decode_ms_median']:9.3f} ms "
                  f"(alone {pat['decode_alone_ms_median']:9.3f})"
                  + (f"; device mixed {pat['device_ms_median']:9.3f} ms (paused {dev_extra['paused_device_ms_median']:9.3f})"
                     if "device_ms_median" in pat and dev_extra else "")
                  + (f", pipelined {pat['pipelined_device_ms_median']:9.3f} ms"
                     if "pipelined_device_ms_median" in pat else ""), flush=True)
        if dev_extra:  # "stream_mixed": the grid's mixed steps in turn, as a busy engine runs them
            # the long form (STREAM_S, in bins) with a full sustain; a short one (tests, --sustain-s < SUSTAIN_S) as before
            long = sustain_s >= SUSTAIN_S
            try:
                stream = stream_mixed(runner, shapes, cfg, vocab, pause_s, repeats,
                                      STREAM_S if long else min(PATTERN_S, sustain_s),
                                      STREAM_IDLE_S if long else 0.0, STREAM_BIN_S if long else None,
                                      STREAM_PREFIX_STARTS if long else ())
            except Exception as e:  # noqa: BLE001 -- a measurement beside the points: the profile goes on
                stream = None
                runs.append({"run": "stream_mixed_failed", "error": f"{type(e).__name__}: {e}"})
                print(f"pause check: stream_mixed failed ({type(e).__name__}: {e}); the profile goes on", flush=True)
            if stream:
                runs.append(stream)
                print(f"pause check: stream_mixed {len(stream['shapes'])} mixed shapes in turn, pipelined / paused "
                      f"device {stream['ratio']:.4f}"
                      + (" by second " + " ".join(f"{b['ratio']:.3f}" for b in stream["bins"])
                         if stream.get("bins") else ""), flush=True)
        if dev_extra and long:  # "stream_kind": each kind's own throttle, in device time
            big = packed_check_shape(shapes, p)
            # (name, its shape (d, p, c, k, s) or None where the grid has none): each kind's shape travels
            # with its run, so that the cost model can place it among the anchors by its own rate
            n_check, k_check = p, k
            light_c = min(cc for _, cc in decs)
            kinds = [("prefill", (0, n_check, 0, k_check, 0)),
                     ("mixed", (dm, pm, dec[1], 1, 0)),
                     ("mixed_two_chunks", (dm, pm, dec[1], 2, 0) if pm % 2 == 0 and pm >= 2 else None),
                     # a light-decode mixed step: 8 decodes at the grid's shortest context beside the chunk (on
                     # the H100 such steps ran 1.012 back to back, the long-context mixed step 0.997: power by kind
                     # beyond what the token rate tells, for the weights between the anchors)
                     ("mixed_short", (min(8, dm), pm, light_c, 1, 0)),
                     ("decode", (dm, 0, dec[1], 0, 0)),
                     ("packed", tuple(big) if big is not None else None)]
            bs, nb = cfg.block_size, cfg.num_blocks
            for name, shape in kinds:
                if shape is None:
                    continue
                try:
                    d_, p_, c_, k_, s_ = shape
                    step = make_step(d_, p_, c_, bs, nb, vocab, max(1, k_), s_)
                    got = stream_kind(runner, name, step, pause_s, repeats)
                    if got:
                        got["shape"] = list(shape)
                except Exception as e:  # noqa: BLE001 -- a measurement beside the points: the profile goes on
                    got = {"run": "stream_kind_failed", "kind": name, "error": f"{type(e).__name__}: {e}"}
                if got:
                    runs.append(got)
                    if got["run"] == "stream_kind":
                        print(f"pause check: stream_kind {name:16s} pipelined / paused device {got['ratio']:.4f} "
                              f"{got['nvml']}", flush=True)
    doc = {"num_prefill_tokens": p, "num_prefill_seqs": k, "runs": runs}
    if sustain_s > 0:
        big = packed_check_shape(shapes, p)
        if big is None:
            doc["sustained_packed_skipped"] = (f"no prefill-only point of more than the check's {p} "
                                               "tokens in the grid")
        else:
            runs.append(sustained_packed(runner, big, cfg, vocab, pause_s, repeats, sustain_s))
    return doc


def sustained_packed(runner, shape, cfg, vocab: int, pause_s: float, repeats: int, sustain_s: float) -> dict:
    """The pause check's "sustained_packed" run (the comment after MIXED_DECODES): the prefill-only step
    `shape` (d, p, c, k, s) paused (`pause_s` before each of `repeats` after one warm-up), then
    SUSTAIN_IDLE_S idle and `sustain_s` back to back, traced; the back-to-back figures
    (`step_ms_*`) are the trace's last `repeats` steps."""
    _, pp, _, kp, _ = shape
    chunks = make_step(0, pp, 0, cfg.block_size, cfg.num_blocks, vocab, kp)
    paused = measure(runner, chunks, repeats, 1, pause_s)
    extra = sustained_trace(runner, chunks, sustain_s, SUSTAIN_IDLE_S)
    tail = extra["trace_ms"][-repeats:]
    run = {"run": "sustained_packed", "pause_ms": 0.0, "num_decode_seqs": 0, "num_prefill_tokens": pp,
           "num_prefill_seqs": kp, "decode_context_len": 0, "paused_ms_median": statistics.median(paused),
           "paused_pause_ms": pause_s * 1000, "step_ms_median": statistics.median(tail),
           "step_ms_min": min(tail), "step_ms_max": max(tail), "sm_clock_mhz": sm_clock_mhz(runner.device),
           **extra}
    print(f"pause check d=0 p={pp} k={kp}: sustained_packed paused {run['paused_ms_median']:9.3f} ms, "
          f"back to back {run['step_ms_median']:9.3f} ms", flush=True)
    return run


def point(d: int, p: int, c: int, k: int, s: int, ms: list[float],
          launch_ms: list[float] | None = None, clock_mhz: int | None = None,
          verify: bool = False, device_ms: list[float] | None = None,
          decode_runs: Sequence[Sequence[int]] | None = None) -> dict:
    """One profile point (docs/contracts.md, "profile JSON"). `verify`: its k chunks of p / k
    tokens were verifies (`num_draft_tokens` = p - k drafts), not prefill chunks. `device_ms`:
    its device-timed repetitions (`measure_device`), when taken. `decode_runs`: the d decodes'
    contexts as [[count, context], ...] in launch order (a spread point, `spread_shapes`): then
    `context_len` is their rounded mean, `num_context_tokens` counts their exact sum, and the
    point carries `decode_context_lens` and `decode_spread`."""
    k = k if p else 0
    dec_tokens = d * c
    if decode_runs is not None:
        ctxs = expand_context_lens(decode_runs)
        if len(ctxs) != d:
            raise ValueError(f"{d} decodes, {len(ctxs)} contexts in {decode_runs}")
        dec_tokens = sum(ctxs)
        c = round(dec_tokens / d) if d else 0
    doc = {"num_decode_seqs": d, "num_prefill_tokens": p, "context_len": c if d else 0,
           "num_prefill_seqs": k, "prefill_context_len": s if p else 0,
           "num_context_tokens": dec_tokens + p + k * (s if p else 0), "step_ms": statistics.fmean(ms),
           "step_ms_min": min(ms), "step_ms_median": statistics.median(ms), "repeats": len(ms)}
    if decode_runs is not None:
        doc["decode_context_lens"] = [[int(n), int(x)] for n, x in decode_runs]
        # unequal contexts: a spread point; all equal: an off-edge point (`tile_edge_shapes`)
        doc["decode_spread"] = "one_long" if len({int(x) for _n, x in decode_runs}) > 1 else "off_edge"
    if verify and p:
        doc["num_draft_tokens"] = p - k
    if launch_ms:
        doc["launch_ms_median"] = statistics.median(launch_ms)
    if clock_mhz is not None:
        doc["sm_clock_mhz"] = clock_mhz
    if device_ms:
        doc["device_ms_median"] = statistics.median(device_ms)
        doc["device_ms_min"] = min(device_ms)
    return doc


def run(args: argparse.Namespace) -> dict:
    from backend.engine.args import backend_config
    from backend.engine.assemble import ServingOptions, create_engine

    engine, loaded = create_engine(backend_config(args),
                                   ServingOptions(quantization=getattr(args, "quantization", "none"),
                                                  fp8_gemv_max_m=getattr(args, "fp8_gemv_max_m", None)))
    runner, cfg = engine.runner, engine.config
    kv_fill = fill_kv_pool(runner, getattr(args, "kv_fill", "random"))
    packed_ds = None if args.packed_decode_batch_sizes is None else int_list(args.packed_decode_batch_sizes)
    shapes = step_shapes(int_list(args.decode_batch_sizes), int_list(args.prefill_tokens),
                         int_list(args.context_lens), int_list(args.packed_prefill_seqs),
                         int_list(args.prefill_context_lens), packed_ds, max_num_seqs=cfg.max_num_seqs,
                         max_num_batched_tokens=cfg.max_num_batched_tokens,
                         max_model_len=cfg.max_model_len,
                         budget_packed=getattr(args, "budget_packed_points", "on") == "on")
    cs = int_list(args.context_lens)
    if runner.graphs is not None and args.decode_bucket_points != "off":
        shapes += decode_bucket_shapes(shapes, runner.graphs.buckets, cs,
                                       first_batches=args.decode_bucket_points == "on")
    verifies = []
    if args.verify_drafts and cs:
        vds = packed_ds if packed_ds is not None else sorted({d for d, _, _, k, s in shapes
                                                              if (k > 1 or s > 0)} | {0})
        verifies = verify_shapes(int_list(args.verify_drafts), int_list(args.packed_prefill_seqs),
                                 int_list(args.prefill_context_lens), vds, cs[0],
                                 max_num_seqs=cfg.max_num_seqs,
                                 max_num_batched_tokens=cfg.max_num_batched_tokens,
                                 max_model_len=cfg.max_model_len)
    spreads = []
    if getattr(args, "decode_spread_points", "on") == "on":
        spreads = spread_shapes(int_list(args.decode_batch_sizes), cs, max_num_seqs=cfg.max_num_seqs,
                                max_num_batched_tokens=cfg.max_num_batched_tokens,
                                max_model_len=cfg.max_model_len)
    # the mixed spread points (issue 35, session 20): each spread point's decodes beside one chunk of
    # the pause check's mixed step; on the H200's mixed-lengths 6.7B the live steps with a 256-token
    # chunk beside 9-32 decodes ran 0.977 of the model at max / mean context >= 2 against 1.011
    # below it, where the decode-only launch model over-charges them (bench/results/
    # fidelity_grid_h200_s20): what a mixed launch model needs measured
    edges = []
    if spreads and getattr(args, "tile_edge_points", "off") == "on":
        edges = tile_edge_shapes(int_list(args.decode_batch_sizes), cs, max_num_seqs=cfg.max_num_seqs,
                                 max_num_batched_tokens=cfg.max_num_batched_tokens,
                                 max_model_len=cfg.max_model_len)
    spread_jobs = [((d, 0, round(sum(expand_context_lens(r)) / d), 1, 0), False, r)
                   for d, r in spreads + edges]
    mixed_spreads = []
    if getattr(args, "mixed_spread_points", "on") == "on":
        for (d, _, c, k, s), verify, r in spread_jobs:
            pm = min(MIXED_CHUNK, cfg.max_num_batched_tokens - d)
            if pm >= 1:
                mixed_spreads.append(((d, pm, c, k, s), verify, r))
    # (shape, verify, decode context runs or None): the grid, the spread decode points (measured
    # as the uniform decode points: no pause), the mixed spread points (paused, as every point with
    # prefill), then the verifies
    jobs = ([(x, False, None) for x in shapes] + spread_jobs + mixed_spreads
            + [(x, True, None) for x in verifies])
    points = []
    conditioning = getattr(args, "decode_conditioning", "on") == "on"
    conditioned = 0
    prev_p = None  # the previous job's prefill tokens (None: no job yet)
    for (d, p, c, k, s), verify, runs in jobs:
        chunks = make_step(d, p, c, cfg.block_size, cfg.num_blocks, loaded.config.vocab_size, k, s,
                           verify=verify, decode_contexts=expand_context_lens(runs) if runs else None,
                           block_order=getattr(args, "kv_block_order", "contiguous"))
        if conditioning and d and not p and prev_p == 0:
            conditioned += condition_decode_point(runner, d, c, int_list(args.prefill_tokens), cfg,
                                                  loaded.config.vocab_size, args.pause_ms / 1000)
        prev_p = p
        launch_ms: list[float] = []
        ms = measure(runner, chunks, args.repeats, args.warmup,
                     args.pause_ms / 1000 if p and not verify else 0.0, launch_ms)
        clock = sm_clock_mhz(runner.device)
        device_ms = (measure_device(runner, chunks, args.repeats,
                                    args.pause_ms / 1000 if p and not verify else 0.0)
                     if getattr(args, "device_time", "off") == "on" else None)
        points.append(point(d, p, c, k, s, ms, launch_ms, clock, verify, device_ms, runs))
        print(f"d={d:4d} {'v' if verify else 'p'}={p:6d} c={c:6d} k={k:3d} s={s:6d}  "
              + (f"spread {' + '.join(f'{n}x{x}' for n, x in runs)}  " if runs else "")
              + f"{statistics.fmean(ms):9.3f} ms  launch {statistics.median(launch_ms):7.3f} ms"
              + (f"  device {statistics.median(device_ms):7.3f} ms" if device_ms else "")
              + (f"  sm {clock} MHz" if clock is not None else ""), flush=True)
    pairs = []
    if spreads and getattr(args, "tile_edge_pairs", "on") == "on":
        pairs = tile_edge_pairs(runner, tile_pair_shapes(int_list(args.decode_batch_sizes), cs,
                                                         max_num_seqs=cfg.max_num_seqs,
                                                         max_num_batched_tokens=cfg.max_num_batched_tokens,
                                                         max_model_len=cfg.max_model_len),
                                cfg, loaded.config.vocab_size, args.repeats, args.pause_ms / 1000,
                                MIXED_CHUNK if getattr(args, "mixed_spread_points", "on") == "on" else 0)
    pause_check = None
    if args.pause_ms > 0 and getattr(args, "pause_check", "on") == "on":
        pause_check = compare_pause(runner, shapes, cfg, loaded.config.vocab_size, args.pause_ms / 1000)
    order_check = []  # last: its prefilled run leaves the pool's first blocks written
    if getattr(args, "block_order_check", "on") == "on":
        grid_ds = {d for d, p, _c, _k, _s in shapes if d and not p}
        order_check = block_order_check(runner, [d for d in BLOCK_ORDER_CHECK_DS if d in grid_ds], cs[0], cfg,
                                        loaded.config.vocab_size, args.repeats, args.warmup,
                                        getattr(args, "device_time", "off") == "on",
                                        "random" if kv_fill == "random" else "zeros")
    dev = loaded.device
    from sims.profile_cost import plan_leads
    leads = plan_leads({"points": points})
    return {
        "format": FORMAT, "model": loaded.config.name, "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(loaded.dtype).removeprefix("torch."), "block_size": cfg.block_size,
        "quantization": getattr(engine, "serving_info", {}).get("quantization", "none"),
        # fp8 weights: the rows up to which a linear ran the GEMV (profiles before session 39: 32)
        **({"fp8_gemv_max_m": engine.serving_info["fp8_gemv_max_m"]}
           if "fp8_gemv_max_m" in getattr(engine, "serving_info", {}) else {}),
        "num_kv_blocks": cfg.num_blocks, "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens, "max_model_len": cfg.max_model_len,
        "torch_version": torch.__version__, "pause_ms": args.pause_ms,
        # the mixed-step CUDA-graph token buckets steps ran as ([]: eager), so the cost model
        # charges a step for its bucket (sims.profile_cost)
        "cuda_graph_token_buckets": list(runner.graphs.token_buckets) if runner.graphs is not None else [],
        # and the decode-only steps' batch buckets (a step of d sequences runs the smallest >= d)
        "cuda_graph_decode_buckets": list(runner.graphs.buckets) if runner.graphs is not None else [],
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "points": points,
        # the decode kernel's launch plan per decode bucket (splits, programs resident at once): a
        # decode of unequal contexts runs as a tail on its longest sequence's programs, which the
        # simulator models from this plan and the spread points (issue 35, session 19)
        "decode_attention": runner_decode_attention(runner, cfg, num_kv_heads(runner, loaded),
                                                    int_list(args.decode_batch_sizes)),
        # the async loop's plan lead by the kind of step in flight, from the points' launch times
        # (sims.profile_cost.plan_leads: the engine's deadline formula, not the serving loop measured)
        **({"plan_lead_ms": {k.removesuffix("_s"): round(v * 1e3, 4) for k, v in leads.items()}}
           if leads else {}),
        **({"pause_check": pause_check} if pause_check else {}),
        "kv_block_order": getattr(args, "kv_block_order", "contiguous"),
        "kv_fill": kv_fill,  # what the pool held while the points were measured (absent: zeros)
        # the decode-only points run after the grid's paused mixed step (`condition_decode_point`;
        # absent: none were, the profiles before 2026-12-07)
        **({"decode_conditioning": {"points": conditioned, "repeats": CONDITION_REPEATS,
                                    "pause_ms": args.pause_ms}} if conditioning else {}),
        **({"block_order_check": order_check} if order_check else {}),
        # every decode on a tile edge, one token past it and at the next edge, timed in turn
        # (`tile_edge_pairs`; absent: the profiles before 2026-12-07 09:30 UTC, which have at most
        # the off-edge points; the first two with pairs have no next twin)
        **({"tile_edge_pairs": pairs} if pairs else {}),
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        doc = run(args)
    except ModelLoadError as exc:
        print(f"tidegate backend profile: error: {exc}", file=sys.stderr)
        return 1
    if len(doc["points"]) < 2:
        print("tidegate backend profile: error: fewer than two grid points fit the limits", file=sys.stderr)
        return 1
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {len(doc['points'])} points to {args.out}")
    return 0
