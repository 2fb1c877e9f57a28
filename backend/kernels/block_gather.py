"""Whole KV blocks of every layer's pool tensors, gathered into one block-major staging buffer
(and scattered back) in a single launch: the host tier's copies (backend.kv.host_tier).

    pools   T tensors, each contiguous with the block index first (a layer's K or V pool, or a
            quantized pool's codes / scales); tensor t's block row is row_bytes[t] bytes
    stage   [n, block_bytes] uint8, block_bytes = sum(row_bytes); staging row i holds block
            ids[i] of every tensor, tensor t at byte offset offsets[t] (in the order given)

    gather  stage[i, off_t : off_t + row_t] = pool_t[ids[i]]        for every i, t
    scatter pool_t[ids[i]] = stage[i, off_t : off_t + row_t]

Why a kernel: a block of the 33B preset is 124 tensors' rows (62 layers, K and V), so moving it
as one torch copy per tensor is 124 launches of ~33 KB; that per-copy cost, not PCIe, bounded the
tier's copies at 2.78 GB/s. Here one launch moves every tensor's row of a whole batch of blocks,
and the staging rows then cross PCIe as a few large copies.

The pools are addressed through a device table of their base addresses (int64, cast to pointers
in the kernel), so the launch does not depend on how many tensors there are. Rows are moved as
32-bit words: every row size and offset must be a multiple of 4 bytes (`word_aligned`).
`gather_blocks_reference` / `scatter_blocks_reference` are the torch oracle (one index op per
tensor) and the path wherever Triton is not used.
"""
from __future__ import annotations

import torch

from backend.kernels.triton_utils import HAS_TRITON, cdiv, tl, triton, use_triton

WORDS_PER_PROGRAM = 2048   # 8 KB of a row per program


def word_aligned(pools: list[torch.Tensor]) -> bool:
    """Can the kernel move these pools (contiguous, rows a multiple of 4 bytes)?"""
    return all(p.is_contiguous() and p[0].nbytes % 4 == 0 and p.data_ptr() % 4 == 0
               for p in pools)


def _rows(pool: torch.Tensor) -> torch.Tensor:
    """The pool as raw bytes, one row per block."""
    return pool.view(torch.uint8).reshape(pool.shape[0], -1)


def gather_blocks_reference(pools: list[torch.Tensor], ids: torch.Tensor,
                            stage: torch.Tensor) -> None:
    off = 0
    for p in pools:
        rows = _rows(p)
        stage[: len(ids), off:off + rows.shape[1]] = rows.index_select(0, ids)
        off += rows.shape[1]


def scatter_blocks_reference(pools: list[torch.Tensor], ids: torch.Tensor,
                             stage: torch.Tensor) -> None:
    off = 0
    for p in pools:
        rows = _rows(p)
        rows.index_copy_(0, ids, stage[: len(ids), off:off + rows.shape[1]])
        off += rows.shape[1]


class BlockGather:
    """The launch metadata of one fixed list of pools (built once: the pools never move)."""

    def __init__(self, pools: list[torch.Tensor]) -> None:
        self.pools = pools
        row_bytes = [p[0].nbytes for p in pools]
        self.block_bytes = sum(row_bytes)
        self.use_kernel = HAS_TRITON and use_triton(pools[0]) and word_aligned(pools)
        if self.use_kernel:
            device = pools[0].device
            offsets = [sum(row_bytes[:t]) for t in range(len(pools))]
            self.addrs = torch.tensor([p.data_ptr() for p in pools], dtype=torch.int64,
                                      device=device)
            self.row_words = torch.tensor([b // 4 for b in row_bytes], dtype=torch.int64,
                                          device=device)
            self.offsets = torch.tensor([o // 4 for o in offsets], dtype=torch.int64,
                                        device=device)
            self.max_row_words = max(row_bytes) // 4

    def gather(self, ids: torch.Tensor, stage: torch.Tensor) -> None:
        """stage[:len(ids)] <- blocks `ids` (int64, on the pools' device) of every pool."""
        self._run(ids, stage, to_stage=True)

    def scatter(self, ids: torch.Tensor, stage: torch.Tensor) -> None:
        """Blocks `ids` of every pool <- stage[:len(ids)] (ids distinct)."""
        self._run(ids, stage, to_stage=False)

    def _run(self, ids: torch.Tensor, stage: torch.Tensor, to_stage: bool) -> None:
        assert stage.dtype == torch.uint8 and stage.shape[1] == self.block_bytes
        assert stage.is_contiguous() and len(ids) <= stage.shape[0]
        if not len(ids):
            return
        if not self.use_kernel:
            (gather_blocks_reference if to_stage else scatter_blocks_reference)(
                self.pools, ids, stage)
            return
        grid = (len(ids), len(self.pools), cdiv(self.max_row_words, WORDS_PER_PROGRAM))
        _block_rows_kernel[grid](
            self.addrs, self.row_words, self.offsets, ids, stage.view(torch.int32),
            self.block_bytes // 4, TO_STAGE=to_stage, WORDS=WORDS_PER_PROGRAM, num_warps=4)


if HAS_TRITON:

    @triton.jit
    def _block_rows_kernel(addrs_ptr, row_words_ptr, offsets_ptr, ids_ptr, stage_ptr,
                           stage_row_words, TO_STAGE: tl.constexpr, WORDS: tl.constexpr):
        i = tl.program_id(0)
        t = tl.program_id(1)
        start = tl.program_id(2) * WORDS
        row_words = tl.load(row_words_ptr + t)
        if start < row_words:
            pool = tl.load(addrs_ptr + t).to(tl.pointer_type(tl.int32))
            block = tl.load(ids_ptr + i)
            offs = start + tl.arange(0, WORDS)
            mask = offs < row_words
            pool_row = pool + block * row_words + offs
            stage_row = (stage_ptr + i.to(tl.int64) * stage_row_words
                         + tl.load(offsets_ptr + t) + offs)
            if TO_STAGE:
                tl.store(stage_row, tl.load(pool_row, mask=mask), mask=mask)
            else:
                tl.store(pool_row, tl.load(stage_row, mask=mask), mask=mask)
