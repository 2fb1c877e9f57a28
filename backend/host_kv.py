"""Host-memory KV tier storage: a host twin of every KV pool, and the block copies between them.

Which host block holds what is decided by `scheduler.host_tier.HostTier`; this object holds the
bytes (pinned memory on CUDA, so copies are DMA and asynchronous; plain memory on the CPU) and
performs the queued copies, in queue order, before the step's forward pass:

    ("d2h", gpu_block, host_block)    save a block (evicted prefix, or a swapped-out sequence)
    ("h2d", host_block, gpu_block)    bring a host hit back into a fresh GPU block

Every pool is moved as the tensors that make it up, each indexed by block first: a plain pool
is one tensor [num_blocks, block_size, Hkv, D]; a quantized pool (backend.kv_quant) is its codes
as raw bytes and its scales. The host twin has the same layout with `num_host_blocks` rows.

On CUDA the copies run on their own stream: it first waits for the compute stream (a d2h copy
reads K/V the previous step wrote) and the compute stream then waits for it (the next forward
reads h2d blocks and overwrites saved ones). They overlap with the host's own work, not with a
forward pass: the copies of a step are needed by that step.
"""
from __future__ import annotations

import time

import torch

from backend.kv_cache import KVCache


def _block_tensors(pool) -> list[torch.Tensor]:
    """The tensors of one layer's K or V pool, block index first."""
    if isinstance(pool, torch.Tensor):
        return [pool]
    return [pool.data.view(torch.uint8), pool.scale]  # backend.kv_quant.QuantizedPages


class HostKVCache:
    def __init__(self, kv: KVCache, num_host_blocks: int) -> None:
        if num_host_blocks < 1:
            raise ValueError(f"num_host_blocks must be >= 1, got {num_host_blocks}")
        self.num_blocks = num_host_blocks
        self.device_tensors = [t for pool in (*kv.k_caches, *kv.v_caches) for t in _block_tensors(pool)]
        device = self.device_tensors[0].device
        pin = device.type == "cuda"
        self.host_tensors = [torch.zeros((num_host_blocks, *t.shape[1:]), dtype=t.dtype,
                                         pin_memory=pin) for t in self.device_tensors]
        self.stream = torch.cuda.Stream(device) if pin else None
        self.num_copies = 0

    @property
    def block_bytes(self) -> int:
        return sum(t[0].nbytes for t in self.host_tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.host_tensors)

    def run(self, copies: list[tuple[str, int, int]]) -> None:
        """Perform the copies in order (see the module docstring)."""
        if not copies:
            return
        self.num_copies += len(copies)
        if self.stream is None:
            self._copy(copies)
            return
        compute = torch.cuda.current_stream()
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            self._copy(copies)
        compute.wait_stream(self.stream)

    def _copy(self, copies: list[tuple[str, int, int]]) -> None:
        non_blocking = self.stream is not None
        for kind, src, dst in copies:
            if kind == "d2h":
                for dev, host in zip(self.device_tensors, self.host_tensors):
                    host[dst].copy_(dev[src], non_blocking=non_blocking)
            elif kind == "h2d":
                for dev, host in zip(self.device_tensors, self.host_tensors):
                    dev[dst].copy_(host[src], non_blocking=non_blocking)
            else:
                raise ValueError(f"unknown tier copy {kind!r}")

    def measure_bandwidth(self, num_blocks: int = 8, repeats: int = 3) -> float:
        """Bytes per second of d2h + h2d block copies on this machine (the swap cost rule's
        rate; one direction). Copies blocks 0.. onto themselves through host blocks 0.., so it
        must run before the pools hold anything."""
        n = min(num_blocks, self.num_blocks, self.device_tensors[0].shape[0])
        copies = [("d2h", i, i) for i in range(n)] + [("h2d", i, i) for i in range(n)]
        best = float("inf")
        for _ in range(repeats):
            if self.stream is not None:
                torch.cuda.synchronize()
            start = time.perf_counter()
            self._copy(copies) if self.stream is None else self.run(copies)
            if self.stream is not None:
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        self.num_copies = 0
        return 2 * n * self.block_bytes / max(best, 1e-9)
