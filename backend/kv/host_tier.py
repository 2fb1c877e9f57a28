"""Host-memory KV tier storage: a host twin of every KV pool, and the block copies between them.

Which host block holds what is decided by `scheduler.host_tier.HostTier`; this object holds the
bytes (pinned memory on CUDA, so copies are DMA and asynchronous; plain memory on the CPU) and
performs the queued copies, in queue order, before the step's forward pass:

    ("d2h", gpu_block, host_block)    save a block (evicted prefix, or a swapped-out sequence)
    ("h2d", host_block, gpu_block)    bring a host hit back into a fresh GPU block

Host storage is block-major: one [num_host_blocks, block_bytes] byte array whose row is a whole
block of every layer's pool tensors (K and V; a quantized pool's codes and scales), in the order
of `backend.kernels.block_gather`. A copy batch therefore moves blocks, not layers:

    d2h   gather the batch's GPU blocks of every tensor into a device staging buffer (one launch),
          then one copy per run of consecutive host blocks, staging -> pinned host rows
    h2d   one copy per run of consecutive host blocks into the staging buffer, then scatter it
          into the GPU blocks of every tensor (one launch)

(Before this, each block went as one copy per layer per K/V, ~66 KB each on the 33B preset: the
per-copy cost bounded the tier at 2.78 GB/s on the H200.) A batch is the longest stretch of
queued copies of one kind with distinct destinations, cut to the staging buffer's size; stretches
run in queue order, so a block saved and loaded again in the same step sees its saved bytes.
On the CPU the gather / scatter index the host rows directly (no staging).

On CUDA the copies run on their own stream: it first waits for the compute stream (a d2h copy
reads K/V the previous step wrote) and the compute stream then waits for it (the next forward
reads h2d blocks and overwrites saved ones). They overlap with the host's own work, not with a
forward pass: the copies of a step are needed by that step.
"""
from __future__ import annotations

import time

import torch

from backend.kv.pools import KVCache

STAGING_BYTES = 64 << 20   # device staging buffer of the GPU path (whole blocks, at least one)


def _block_tensors(pool) -> list[torch.Tensor]:
    """The tensors of one layer's K or V pool, block index first."""
    if isinstance(pool, torch.Tensor):
        return [pool]
    return [pool.data.view(torch.uint8), pool.scale]  # backend.kv.formats.QuantizedPages


def copy_batches(copies: list[tuple[str, int, int]], max_len: int):
    """Queue-ordered batches (kind, [(src, dst), ...]): one kind, distinct destinations, at most
    `max_len` copies each."""
    batch: list[tuple[int, int]] = []
    kind, dsts = None, set()
    for k, src, dst in copies:
        if k not in ("d2h", "h2d"):
            raise ValueError(f"unknown tier copy {k!r}")
        if batch and (k != kind or dst in dsts or len(batch) == max_len):
            yield kind, batch
            batch, dsts = [], set()
        kind = k
        batch.append((src, dst))
        dsts.add(dst)
    if batch:
        yield kind, batch


def host_runs(host_ids: list[int]) -> list[tuple[int, int, int]]:
    """(first index, first host block, length) of each run of consecutive host blocks."""
    runs = []
    for i, h in enumerate(host_ids):
        if runs and h == runs[-1][1] + runs[-1][2] and i == runs[-1][0] + runs[-1][2]:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((i, h, 1))
    return runs


class HostKVCache:
    def __init__(self, kv: KVCache, num_host_blocks: int, gather_cls) -> None:
        """`gather_cls` is `backend.kernels.block_gather.BlockGather` (passed in by the assembler, so
        that `kv/` sits below `kernels/`: the kernels read the pools' formats, the tier uses a kernel)."""
        if num_host_blocks < 1:
            raise ValueError(f"num_host_blocks must be >= 1, got {num_host_blocks}")
        self.num_blocks = num_host_blocks
        self.device_tensors = [t for pool in (*kv.k_caches, *kv.v_caches) for t in _block_tensors(pool)]
        self.device = self.device_tensors[0].device
        self.gather = gather_cls(self.device_tensors)
        pin = self.device.type == "cuda"
        self.host_blocks = torch.zeros((num_host_blocks, self.gather.block_bytes),
                                       dtype=torch.uint8, pin_memory=pin)
        if pin:
            self.stream = torch.cuda.Stream(self.device)
            rows = max(1, min(num_host_blocks, STAGING_BYTES // self.gather.block_bytes))
            self.staging = torch.empty((rows, self.gather.block_bytes), dtype=torch.uint8,
                                       device=self.device)
        else:
            self.stream = self.staging = None
        self.num_copies = 0       # blocks moved (either way)
        self.num_transfers = 0    # host<->device copy calls that moved them

    @property
    def block_bytes(self) -> int:
        return self.gather.block_bytes

    @property
    def nbytes(self) -> int:
        return self.host_blocks.nbytes

    def host_block(self, host_block: int, tensor: int) -> torch.Tensor:
        """Tensor `tensor`'s part of a host block, shaped like that tensor's block (a view)."""
        t = self.device_tensors[tensor]
        off = sum(d[0].nbytes for d in self.device_tensors[:tensor])
        return self.host_blocks[host_block, off:off + t[0].nbytes].view(t.dtype).view(t.shape[1:])

    def run(self, copies: list[tuple[str, int, int]]) -> None:
        """Perform the copies in order (see the module docstring)."""
        if not copies:
            return
        self.num_copies += len(copies)
        if self.stream is None:
            for kind, batch in copy_batches(copies, len(copies)):
                self._copy_cpu(kind, batch)
            return
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            for kind, batch in copy_batches(copies, self.staging.shape[0]):
                self._copy_gpu(kind, batch)
        compute.wait_stream(self.stream)

    def _copy_cpu(self, kind: str, batch: list[tuple[int, int]]) -> None:
        src = torch.tensor([s for s, _ in batch], dtype=torch.long)
        dst = torch.tensor([d for _, d in batch], dtype=torch.long)
        if kind == "d2h":   # host rows dst <- device blocks src
            stage = torch.empty((len(batch), self.block_bytes), dtype=torch.uint8)
            self.gather.gather(src, stage)
            self.host_blocks.index_copy_(0, dst, stage)
        else:               # device blocks dst <- host rows src
            self.gather.scatter(dst, self.host_blocks.index_select(0, src))
        self.num_transfers += 1

    def _copy_gpu(self, kind: str, batch: list[tuple[int, int]]) -> None:
        # staging row i <-> the i-th copy in host-block order, so runs of host blocks are long
        order = sorted(range(len(batch)), key=lambda i: batch[i][1 if kind == "d2h" else 0])
        pairs = [batch[i] for i in order]
        n = len(pairs)
        if kind == "d2h":
            gpu_ids, host_ids = [s for s, _ in pairs], [d for _, d in pairs]
        else:
            host_ids, gpu_ids = [s for s, _ in pairs], [d for _, d in pairs]
        ids = torch.tensor(gpu_ids, dtype=torch.long).to(self.device, non_blocking=True)
        if kind == "d2h":
            self.gather.gather(ids, self.staging)
        for i, h, length in host_runs(host_ids):
            if kind == "d2h":
                self.host_blocks[h:h + length].copy_(self.staging[i:i + length], non_blocking=True)
            else:
                self.staging[i:i + length].copy_(self.host_blocks[h:h + length], non_blocking=True)
            self.num_transfers += 1
        if kind == "h2d":
            self.gather.scatter(ids, self.staging[:n])

    def measure_bandwidth(self, num_blocks: int = 16, repeats: int = 3) -> float:
        """Bytes per second of d2h + h2d block copies on this machine (the swap cost rule's
        rate; one direction). Copies blocks 0.. onto themselves through host blocks 0.., so it
        must run before the pools hold anything."""
        n = min(num_blocks, self.num_blocks, self.device_tensors[0].shape[0])
        copies = [("d2h", i, i) for i in range(n)] + [("h2d", i, i) for i in range(n)]
        best = float("inf")
        for _ in range(repeats + 1):   # the first round compiles the gather kernel
            if self.stream is not None:
                torch.cuda.synchronize()
            start = time.perf_counter()
            self.run(copies)
            if self.stream is not None:
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        self.num_copies = self.num_transfers = 0
        return 2 * n * self.block_bytes / max(best, 1e-9)
