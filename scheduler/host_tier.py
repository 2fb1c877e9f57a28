"""The host-memory tier of the paged KV cache: which host block holds which prefix block.

The GPU pool (scheduler.block_manager) is tier 0; this is tier 1, a pool of host blocks of the
same size. Pure bookkeeping: the bytes are moved by the backend (backend.kv.host_tier), in the order
the copies were queued here (`take_copies`).

Host blocks hold *prefix-cache* blocks only, named by the same key as on the GPU
(``(parent_hash, tokens)``), so a host block can be found by the same chain walk as a GPU hit:

    GPU chain    [k0 k1 k2]                      hits on the GPU (no copy)
    host chain             [k3 k4 k5]            copied host -> fresh GPU blocks, then cached
    computed                          [t.. t]    the rest is prefilled

How blocks get here:
  * a cached GPU block that is evicted (its GPU block is about to be overwritten) is saved here
    if there is room; the LRU unpinned host block is dropped to make room;
  * a preempted sequence whose cost rule says "swap" saves all its registered full blocks here
    and *pins* them until it is admitted again (or aborted): a pinned block is never dropped,
    so the sequence resumes with a prefix hit instead of a recompute.

Free list and LRU (front = dropped first) as in the GPU pool::

    _free    stack of host blocks holding nothing
    _lru     OrderedDict of unpinned keyed blocks, least recently used first
    pinned   keyed blocks with a pin count > 0 (in no list)

Every copy is recorded as ("d2h", gpu_block, host_block) or ("h2d", host_block, gpu_block). The
runner must perform them in that order and before the step's forward pass: a GPU block saved
by a d2h copy may be the destination of a later copy or of the step's K/V writes, and a host
block read by an h2d copy may be overwritten by a later d2h copy.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

BlockKey = tuple[int, tuple[int, ...]]
Copy = tuple[str, int, int]

logger = logging.getLogger("tidegate.kv_tier")


@dataclass(frozen=True)
class SwapCostModel:
    """Swap or recompute a preempted sequence: copy time out and back over the host link vs
    prefill time of its tokens. Both rates come from measurements (the backend's copy bandwidth
    and its prefill profile; the simulator's cost model)."""
    block_bytes: int  # one block, all layers, K and V
    copy_bytes_per_s: float  # measured host<->device bandwidth (one direction)
    prefill_s_per_token: float  # measured prefill time per token

    def swap_seconds(self, num_blocks: int) -> float:
        return 2 * num_blocks * self.block_bytes / self.copy_bytes_per_s

    def recompute_seconds(self, num_tokens: int) -> float:
        return num_tokens * self.prefill_s_per_token

    def should_swap(self, num_blocks: int, num_tokens: int) -> bool:
        return num_blocks > 0 and self.swap_seconds(num_blocks) < self.recompute_seconds(num_tokens)

    def should_load(self, block_size: int) -> bool:
        """Whether copying a host block back beats prefilling its tokens (one way, not two: the
        block is already in host memory). False for models whose K/V is large per FLOP (no GQA)
        on a slow link."""
        return self.swap_seconds(1) / 2 < self.recompute_seconds(block_size)


class HostTier:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a host tier needs >= 1 block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._keys: list[BlockKey | None] = [None] * num_blocks
        self._cached: dict[BlockKey, int] = {}
        self._pin_counts = [0] * num_blocks
        self._pins: dict[object, list[int]] = {}  # swapped-out sequence -> host blocks it pins
        self._copies: list[Copy] = []
        self._read_holds: dict[int, int] = {}  # host block -> readers (hold_read)
        self.num_saved_blocks = 0  # d2h copies queued
        self.num_loaded_blocks = 0  # h2d copies queued (host hits)
        self.num_dropped_blocks = 0  # keyed host blocks dropped for room
        self.max_used_blocks = 0  # peak keyed blocks: the host memory the workload used
        # the block manager's kv_events list while it records (scheduler.block_manager), else None
        self.kv_events: list | None = None

    # ---- queries -----------------------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_pinned_blocks(self) -> int:
        return self.num_blocks - len(self._free) - len(self._lru)

    def lookup(self, key: BlockKey) -> int | None:
        return self._cached.get(key)

    def cached_keys(self) -> list[BlockKey]:
        return list(self._cached)

    def swapped_seq_ids(self) -> list[object]:
        return list(self._pins)

    def pending_copies(self) -> list[Copy]:
        return list(self._copies)

    # ---- mutation ----------------------------------------------------------------------------
    def save(self, key: BlockKey, gpu_block: int, pin_for: object = None) -> int | None:
        """Keep `key` (held now by `gpu_block`) in host memory: a d2h copy unless a host block
        already holds it. Pins it for `pin_for` when given. None when every host block is
        pinned (nothing saved)."""
        host = self._cached.get(key)
        if host is None:
            if self._free:
                host = self._free.pop()
            elif self._lru:
                host = self._lru.popitem(last=False)[0]
                del self._cached[self._keys[host]]
                if self.kv_events is not None:  # KV_REMOVED (scheduler.block_manager)
                    self.kv_events.append((1, "CPU", self._keys[host]))
                self.num_dropped_blocks += 1
            else:
                return None
            self._keys[host] = key
            self._cached[key] = host
            if self.kv_events is not None:  # KV_STORED
                self.kv_events.append((0, "CPU", key))
            self._copies.append(("d2h", gpu_block, host))
            self.num_saved_blocks += 1
            used = self.num_blocks - len(self._free)
            self.max_used_blocks = max(self.max_used_blocks, used)
            if pin_for is None:
                self._lru[host] = None
        elif host in self._lru:
            self._lru.move_to_end(host)  # most recently used
        if pin_for is not None:
            if self._pin_counts[host] == 0:
                self._lru.pop(host, None)
            self._pin_counts[host] += 1
            self._pins.setdefault(pin_for, []).append(host)
        return host

    def hold(self, blocks: list[int]) -> None:
        """Pin `blocks` for the span of one allocation (they are read by h2d copies queued in
        it; a save made by the same allocation must not drop them)."""
        for host in blocks:
            if self._pin_counts[host] == 0:
                del self._lru[host]
            self._pin_counts[host] += 1

    def unhold(self, blocks: list[int]) -> None:
        for host in blocks:
            self._pin_counts[host] -= 1
            if self._pin_counts[host] == 0:
                self._lru[host] = None  # most recently used

    def hold_read(self, blocks: list[int]) -> None:
        """Hold `blocks` while a reader outside the owner's loop copies them out
        (BlockManager.hold_prefix); `unhold_read` ends it."""
        self.hold(blocks)
        for host in blocks:
            self._read_holds[host] = self._read_holds.get(host, 0) + 1

    def unhold_read(self, blocks: list[int]) -> None:
        for host in blocks:
            n = self._read_holds[host] - 1
            if n:
                self._read_holds[host] = n
            else:
                del self._read_holds[host]
        self.unhold(blocks)

    def load(self, host_block: int, gpu_block: int) -> None:
        """Queue the copy of a host hit into a fresh GPU block."""
        self._copies.append(("h2d", host_block, gpu_block))
        self.num_loaded_blocks += 1

    def release(self, seq_id: object) -> int:
        """Drop a swapped-out sequence's pins (it resumed, or was aborted); its blocks stay as
        ordinary LRU entries. Returns how many it pinned."""
        blocks = self._pins.pop(seq_id, [])
        self.unhold(blocks)
        return len(blocks)

    def take_copies(self) -> list[Copy]:
        """The copies queued since the last call, in the order they must run."""
        copies, self._copies = self._copies, []
        return copies

    # ---- integrity ---------------------------------------------------------------------------
    def check_integrity(self) -> None:
        keyed = [b for b in range(self.num_blocks) if self._keys[b] is not None]
        free = set(self._free)
        assert len(free) == len(self._free), "a host block twice in the free list"
        assert not free & self._lru.keys(), "a host block both free and in the LRU"
        assert free.isdisjoint(keyed), "a free host block still holds a key"
        assert len(free) + len(keyed) == self.num_blocks, "host blocks unaccounted"
        assert len(self._cached) == len(keyed), "host cache and keys disagree"
        for key, host in self._cached.items():
            assert self._keys[host] == key, f"host cache entry points at block {host} with another key"
        counts = [0] * self.num_blocks
        for seq_id, blocks in self._pins.items():
            assert blocks, f"swapped sequence {seq_id!r} pins nothing"
            for host in blocks:
                counts[host] += 1
        for host, n in self._read_holds.items():
            counts[host] += n
        for host in keyed:  # pins of an allocation in progress never outlive it
            assert counts[host] == self._pin_counts[host], (
                f"host block {host}: pin count {self._pin_counts[host]}, pinned by {counts[host]}")
            assert (counts[host] == 0) == (host in self._lru), (
                f"host block {host}: pinned {counts[host]} times but "
                f"{'in' if host in self._lru else 'not in'} the LRU")
        assert not any(self._pin_counts[b] for b in free), "a free host block is pinned"
