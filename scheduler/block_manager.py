"""Paged KV block allocation: block tables, ref counts, prefix cache, copy-on-write, LRU eviction.

One sequence's slots (block_size = 4 in this picture)::

    block table  [ b7          | b2          | b9            ]
    slots         t0 t1 t2 t3  | t4 t5 t6 t7 | t8 t9 __ __
                  full, cached | full        | partly filled: 2 unused slots

A *slot* is reserved for every token whose K/V is (or will be, this step) written. Only full
blocks whose K/V has been computed are put in the prefix cache (`cache_blocks`, called after a
step), so a request can never hit a block whose K/V does not exist yet.

Free list: the blocks with ref count 0, and its order *is* the eviction order: fresh blocks are
taken from the front. A freed block that holds no cached prefix goes to the front (it is worth
nothing); a freed cached block goes to the back (most recently used), the blocks of one sequence
in reverse so that its tail is evicted before its head. Taking a cached block from the front
evicts it (its cache entry is dropped). All of this is O(1) per block.

A free block only gains a cache entry while referenced, so the free list is always
``[freed uncached blocks] + [never used blocks, ascending] + [cached blocks, LRU first]`` and
is kept as three parts::

    _free_uncached  list used as a stack, its END is the front: taking n fresh blocks is one
                    slice (allocate's batch path), freeing one is an append
    _num_fresh      the never used blocks are the last _num_fresh ids: a count, not a list, so
                    a pool costs O(1) to create (a simulation builds hundreds of 10k-block pools)
    _free_cached    OrderedDict, front = least recently used; a hit takes a block out of it

Prefix hashing: full block i of a sequence has the key ``(parent_hash, tuple(its tokens))``
where ``parent_hash`` is ``hash(key of block i-1)`` and ``ROOT_HASH`` for block 0. Python's
hash of a tuple of ints is the same in every process (PYTHONHASHSEED salts only str/bytes).
The cache maps the key tuple itself to a block, so a match compares the tokens exactly; a false
hit needs two different prefixes with equal 64-bit parent hashes.

Host tier (`num_host_blocks > 0`, scheduler.host_tier): an evicted cached block is saved to host
memory, a prefix walk that ends on the GPU continues there (a host hit takes a fresh GPU block and
an h2d copy), and `swap_out` keeps a preempted sequence's blocks pinned on the host until it is
allocated again. The copies queue on `host.take_copies()`; the runner performs them, in order,
before the next forward pass.

Pins (issue 30): `request_pin(seq_id, ...)` reserves, within `pin_budget_blocks`, a pin of the
sequence's first blocks for `ttl_s`; when the sequence is freed its registered (cached) leading
blocks take one extra reference each, held by the pin, so they are in no free list and cannot be
evicted while it lasts. A pin of the same prefix again refreshes its time. When it expires
(`expire_pins`, also run by `num_free_blocks` once one is due, on `pin_clock`) the reference is
dropped and the blocks join the cached LRU like any freed prefix: evicted in turn, to the host
tier when there is one. A request that could never run beside the pins (nothing holds blocks
that could free, or it needs more than the unpinned pool) makes them yield early, soonest to
expire first (`can_allocate`): a pin never starves a request.

KV events (issue 33): `record_kv_events()` makes `kv_events` a list (None, the default, costs one
attribute test per registered or evicted block) that receives ``(kind, medium, key)`` for every
change of the prefix cache's key set, in order: ``KV_STORED`` when a key is registered
(`cache_blocks`, a host hit loaded back), ``KV_REMOVED`` when it is evicted, ``KV_CLEARED`` first;
medium ``"GPU"`` here, ``"CPU"`` for the host tier's own keys. `take_kv_events` hands them over
(the backend publishes them in vLLM's format: backend.server.kv_events).
"""
from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from scheduler.capacity import DEFAULT_CAPACITY
from scheduler.host_tier import HostTier

ROOT_HASH = 0x7469646567617465  # parent hash of a sequence's first block ("tidegate")
KV_STORED, KV_REMOVED, KV_CLEARED = 0, 1, 2  # kinds of kv_events entries (module doc)
MEDIUM_GPU, MEDIUM_CPU = "GPU", "CPU"  # vLLM's names for the tiers

BlockKey = tuple[int, tuple[int, ...]]


class NoFreeBlocksError(RuntimeError):
    """Raised by allocate/append_slots when the pool is short; call can_* first."""


class BlockManager:
    """Paged KV allocator. Sequences are named by an id (any hashable, usually the request id)."""

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_CAPACITY.block_size,
                 enable_prefix_caching: bool = True, num_host_blocks: int = 0) -> None:
        if num_host_blocks and not enable_prefix_caching:
            raise ValueError("the host KV tier holds prefix-cache blocks: it needs prefix caching")
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # no block can be shared (no prefix cache, never forked): every held block has ref 1, so
        # the counts are not kept (`_ref_counts` stays empty; `fork` makes them on leaving):
        # a simulation builds hundreds of 10k-block pools
        self._exclusive = not enable_prefix_caching
        self._ref_counts = [] if self._exclusive else [0] * num_blocks
        # each block's cache key (None: uncached); empty while nothing can be cached (prefix
        # caching off and never forked, as `_ref_counts`): every entry would stay None
        self._block_keys: list[BlockKey | None] = [None] * num_blocks if not self._exclusive else []
        self._cached: dict[BlockKey, int] = {}  # key -> block holding those tokens' K/V
        self._free_uncached: list[int] = []
        self._num_fresh = num_blocks  # blocks num_blocks - _num_fresh ... num_blocks - 1
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._tables: dict[object, list[int]] = {}
        self._num_tokens: dict[object, int] = {}  # slots reserved per sequence
        self._hashes: dict[object, list[int]] = {}  # hash of each full block registered so far
        self.num_query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.num_hit_tokens = 0  # of which found cached
        self.num_evictions = 0  # cached blocks dropped to make room
        self.host = HostTier(num_host_blocks) if num_host_blocks else None
        self.num_host_hit_tokens = 0  # of num_hit_tokens, found in host memory
        # whether a host hit is copied back (True) or recomputed: set by the owner from the same
        # measured rates as the swap rule (copying one block back vs prefilling its tokens)
        self.load_host_hits = True
        # pins (module doc): budget in blocks (0: pins are refused), the clock their TTLs run on
        self.pin_budget_blocks = 0
        self.pin_clock = time.monotonic
        self._pins: dict[int, list] = {}  # pin id (chain hash of its last block) -> [until, blocks]
        self._pin_refs: dict[int, int] = {}  # pinned block -> pins holding it
        self._pin_heap: list[tuple[float, int]] = []  # (until, pin id), lazily deleted
        self._pin_wanted: dict[object, tuple[int, float, int, float]] = {}  # seq -> (blocks,
        self._pin_reserved = 0  # ttl, reserved, give-up time); blocks reserved by those
        self._read_refs: dict[int, int] = {}  # block -> readers holding it (hold_prefix)
        self.num_pins_refused = 0  # requests served without their pin (over budget)
        self.num_pins_expired = 0
        self.num_pins_yielded = 0  # pins dropped early for a request that could not run beside them
        self.kv_events: list[tuple[int, str, BlockKey | None]] | None = None  # module doc

    # ---- queries -------------------------------------------------------------------------
    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0 (cached or not): what allocation can take."""
        if self._pin_heap and self._pin_heap[0][0] <= self.pin_clock():
            self.expire_pins()
        return len(self._free_uncached) + self._num_fresh + len(self._free_cached)

    def has_seq(self, seq_id: object) -> bool:
        """Whether `seq_id` holds blocks (allocated and not yet freed)."""
        return seq_id in self._tables

    @property
    def num_seqs(self) -> int:
        """Sequences that hold blocks (allocated, not yet freed)."""
        return len(self._tables)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free_uncached) - self._num_fresh - len(self._free_cached)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, referenced or not."""
        return len(self._cached)

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def internal_fragmentation(self) -> float:
        """Unused slots in allocated blocks / allocated slots (0.0 when nothing is allocated)."""
        if self.num_used_blocks == 0:
            return 0.0
        bs = self.block_size
        if self._exclusive:  # no block is shared: each table's last block is its own
            unused = sum(-n % bs for n in self._num_tokens.values())
            return unused / (self.num_used_blocks * bs)
        seen: set[int] = set()
        unused = 0
        for seq_id, table in self._tables.items():
            rem = self._num_tokens[seq_id] % bs
            if rem and table[-1] not in seen:
                seen.add(table[-1])
                unused += bs - rem
        return unused / (self.num_used_blocks * bs)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._tables

    def block_table(self, seq_id: object) -> list[int]:
        """The live table (read-only for callers; it changes on append_slots/free)."""
        return self._tables[seq_id]

    def num_tokens(self, seq_id: object) -> int:
        """Slots reserved for the sequence."""
        return self._num_tokens[seq_id]

    def ref_count(self, block: int) -> int:
        if self._exclusive:  # counts not kept: a held block has 1
            return 0 if block in self._free_uncached or block >= self._first_fresh else 1
        return self._ref_counts[block]

    def seq_ids(self) -> list[object]:
        """The sequences that hold blocks."""
        return list(self._tables)

    def cached_prefixes(self) -> dict[BlockKey, int]:
        """A copy of the prefix cache: block key -> the block holding those tokens' K/V."""
        return dict(self._cached)

    def record_kv_events(self) -> None:
        """Record prefix-cache changes in `kv_events` from now on (module doc), starting with
        ``KV_CLEARED`` and a ``KV_STORED`` for every key held now (GPU, then host), so that a
        consumer's picture is exact from the first entry."""
        events = self.kv_events = [(KV_CLEARED, MEDIUM_GPU, None)]
        events += [(KV_STORED, MEDIUM_GPU, key) for key in self._cached]
        if self.host is not None:
            self.host.kv_events = events
            events += [(KV_STORED, MEDIUM_CPU, key) for key in self.host.cached_keys()]

    def take_kv_events(self) -> list[tuple[int, str, BlockKey | None]]:
        """The entries recorded since the last call, oldest first (empty when not recording)."""
        events = self.kv_events
        if not events:
            return []
        self.kv_events = []
        if self.host is not None:
            self.host.kv_events = self.kv_events
        return events

    def is_cached(self, key: BlockKey) -> bool:
        """Whether some block holds the K/V of `key`: on the GPU (in use, or free and not yet
        evicted) or in the host tier (a hit there is a copy, not a prefill: placement counts it)."""
        return key in self._cached or (self.host is not None and self.host.lookup(key) is not None)

    def free_list(self) -> list[int]:
        """Free blocks in eviction order (front is taken first)."""
        return (self._free_uncached[::-1] + list(range(self._first_fresh, self.num_blocks))
                + list(self._free_cached))

    @property
    def _first_fresh(self) -> int:
        return self.num_blocks - self._num_fresh

    # ---- prefix cache lookup -------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Cached blocks for the longest full-block prefix, leaving >= 1 token to compute, and
        their hashes (changes nothing)."""
        if not self.enable_prefix_caching:
            return [], []
        bs, cached = self.block_size, self._cached
        blocks: list[int] = []
        hashes: list[int] = []
        parent = ROOT_HASH
        for i in range((len(token_ids) - 1) // bs):
            key = (parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            block = cached.get(key)
            if block is None:
                break
            blocks.append(block)
            parent = hash(key)
            hashes.append(parent)
        return blocks, hashes

    def num_blocks_needed(self, token_ids: Sequence[int]) -> int:
        """Free-list entries `allocate(token_ids)` would take now (hits on used blocks are free)."""
        blocks, _ = self.match_prefix(token_ids)
        ref = self._ref_counts
        return self.num_blocks_for(len(token_ids)) - sum(1 for b in blocks if ref[b] > 0)

    def can_allocate(self, token_ids: Sequence[int]) -> bool:
        if not token_ids:
            return False
        need = self.num_blocks_needed(token_ids)
        if need > self.num_free_blocks and self._pins and (
                not self._tables or need > self.num_blocks - len(self._pin_refs)):
            self._yield_pins(need)  # nothing else will ever make room for it
        return need <= self.num_free_blocks

    # ---- mutation --------------------------------------------------------------------------
    def _take_free(self) -> int:
        if self._free_uncached:
            block = self._free_uncached.pop()
        elif self._num_fresh:
            block = self.num_blocks - self._num_fresh
            self._num_fresh -= 1
        else:  # evict: the cached K/V is about to be overwritten
            block, _ = self._free_cached.popitem(last=False)
            if self.host is not None:
                self.host.save(self._block_keys[block], block)
            del self._cached[self._block_keys[block]]
            if self.kv_events is not None:
                self.kv_events.append((KV_REMOVED, MEDIUM_GPU, self._block_keys[block]))
            self._block_keys[block] = None
            self.num_evictions += 1
        if not self._exclusive:
            self._ref_counts[block] = 1
        return block

    def _take_blocks(self, n: int) -> list[int]:
        """`n` blocks from the front of the free list (the caller checked there are enough)."""
        free = self._free_uncached
        if n > len(free):  # all the freed uncached blocks, never used ones, then the LRU front
            blocks = free[::-1]
            free.clear()
            num_evict = n - len(blocks)
            num_fresh = min(num_evict, self._num_fresh)
            if num_fresh:
                first = self.num_blocks - self._num_fresh
                blocks += range(first, first + num_fresh)
                self._num_fresh -= num_fresh
                num_evict -= num_fresh
            self.num_evictions += num_evict
            lru, cached, keys = self._free_cached, self._cached, self._block_keys
            host, events = self.host, self.kv_events
            for _ in range(num_evict):
                block = lru.popitem(last=False)[0]
                if host is not None:
                    host.save(keys[block], block)
                del cached[keys[block]]
                if events is not None:
                    events.append((KV_REMOVED, MEDIUM_GPU, keys[block]))
                keys[block] = None
                blocks.append(block)
        else:
            blocks = free[len(free) - n:]
            del free[len(free) - n:]
            blocks.reverse()
        if not self._exclusive:
            ref = self._ref_counts
            for block in blocks:
                ref[block] = 1
        return blocks

    def allocate(self, seq_id: object, token_ids: Sequence[int]) -> int:
        """Reserve slots for `token_ids` of a new sequence, reusing cached full blocks.

        Returns the number of leading tokens already cached (a multiple of block_size, at most
        len(token_ids) - 1): the prefill starts there.
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        if not token_ids:
            raise ValueError(f"sequence {seq_id!r}: cannot allocate an empty sequence")
        hit_blocks, hashes = self.match_prefix(token_ids)
        ref = self._ref_counts
        num_needed = self.num_blocks_for(len(token_ids)) - sum(1 for b in hit_blocks if ref[b])
        if num_needed > self.num_free_blocks:
            raise NoFreeBlocksError(f"sequence {seq_id!r} needs {num_needed} free blocks, "
                                    f"{self.num_free_blocks} free")
        for block in hit_blocks:
            if ref[block] == 0:
                del self._free_cached[block]
            ref[block] += 1
        host = self.host
        host_hits = ([] if host is None or not self.load_host_hits
                     else self._match_host(token_ids, len(hit_blocks), hashes))
        if host_hits:
            host.hold([h for _, h in host_hits])  # the fresh blocks below may evict to the host
        table = hit_blocks + self._take_blocks(self.num_blocks_for(len(token_ids)) - len(hit_blocks))
        if host_hits:
            self._load_host_hits(table, len(hit_blocks), host_hits, hashes)
            host.unhold([h for _, h in host_hits])
        if host is not None:
            host.release(seq_id)  # a swapped-out sequence is back: its pins are not needed
        self._tables[seq_id] = table
        self._num_tokens[seq_id] = len(token_ids)
        self._hashes[seq_id] = hashes
        num_cached = (len(hit_blocks) + len(host_hits)) * self.block_size
        if self.enable_prefix_caching:
            self.num_query_tokens += len(token_ids)
            self.num_hit_tokens += num_cached
            self.num_host_hit_tokens += len(host_hits) * self.block_size
        return num_cached

    # ---- the host tier ---------------------------------------------------------------------------
    def _match_host(self, token_ids: Sequence[int], start: int,
                    hashes: list[int]) -> list[tuple[BlockKey, int]]:
        """Host blocks continuing the GPU hit chain at full block `start`, leaving >= 1 token to
        compute. Stops at a key the GPU holds (that block is not a hit on the GPU chain, and a
        key has one GPU block)."""
        bs, host, gpu = self.block_size, self.host, self._cached
        parent = hashes[-1] if hashes else ROOT_HASH
        hits = []
        for i in range(start, (len(token_ids) - 1) // bs):
            key = (parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            block = host.lookup(key)
            if block is None or key in gpu:
                break
            hits.append((key, block))
            parent = hash(key)
        return hits

    def _load_host_hits(self, table: list[int], start: int, host_hits: list[tuple[BlockKey, int]],
                        hashes: list[int]) -> None:
        """Queue the h2d copies of host hits into table[start:], and register those blocks: their
        K/V is there before any forward pass reads them (copies run first)."""
        keys, cached, host, events = self._block_keys, self._cached, self.host, self.kv_events
        for (key, host_block), block in zip(host_hits, table[start:]):
            host.load(host_block, block)
            keys[block] = key
            cached[key] = block
            if events is not None:
                events.append((KV_STORED, MEDIUM_GPU, key))
            hashes.append(hash(key))

    # ---- prefix pull between backends (issue 34, backend.kv.transfer) ----------------------------
    def held_prefix(self, token_ids: Sequence[int], start_block: int = 0,
                    max_blocks: int = 0) -> list[tuple[bool, int]]:
        """Where this pool holds the prompt's full blocks from `start_block` on (leaving >= 1
        token to compute): ``(on_gpu, block id or host block id)`` each, up to the first block
        held nowhere (at most `max_blocks`, 0: no limit). Changes nothing, LRU order included.

            blocks      0 .. start_block-1 | start_block ...               | first missing
            this pool   (not looked at)    | held: GPU or host, in order   | stop
        """
        if not self.enable_prefix_caching:
            return []
        bs, gpu, host = self.block_size, self._cached, self.host
        end = (len(token_ids) - 1) // bs
        if max_blocks:
            end = min(end, start_block + max_blocks)
        parent, out = ROOT_HASH, []
        for i in range(end):
            key = (parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            parent = hash(key)
            if i < start_block:
                continue
            block = gpu.get(key)
            if block is not None:
                out.append((True, block))
                continue
            host_block = host.lookup(key) if host is not None else None
            if host_block is None:
                break
            out.append((False, host_block))
        return out

    def hold_prefix(self, token_ids: Sequence[int], start_block: int = 0,
                    max_blocks: int = 0) -> list[tuple[bool, int]]:
        """`held_prefix`, each block then held against eviction until `release_prefix(where)`:
        a GPU block takes a read reference (it leaves the free list; its K/V, computed before it
        was registered, is not written while referenced), a host block a hold. For a reader
        outside the owner's loop (a peer's pull answered off the step loop, issue 34)."""
        where = self.held_prefix(token_ids, start_block, max_blocks)
        ref, lru, reads = self._ref_counts, self._free_cached, self._read_refs
        host = []
        for on_gpu, b in where:
            if not on_gpu:
                host.append(b)
                continue
            if ref[b] == 0:
                del lru[b]
            ref[b] += 1
            reads[b] = reads.get(b, 0) + 1
        if host:
            self.host.hold_read(host)
        return where

    def release_prefix(self, where: Sequence[tuple[bool, int]]) -> None:
        """Drop the holds `hold_prefix` took; a GPU block back at 0 references rejoins the
        cached LRU as its most recently used entry (it was just read)."""
        ref, lru, reads = self._ref_counts, self._free_cached, self._read_refs
        host = []
        for on_gpu, b in where:
            if not on_gpu:
                host.append(b)
                continue
            n = reads[b] - 1
            if n:
                reads[b] = n
            else:
                del reads[b]
            ref[b] -= 1
            if ref[b] == 0:
                lru[b] = None
        if host:
            self.host.unhold_read(host)

    @property
    def num_read_held_blocks(self) -> int:
        return len(self._read_refs)

    def can_import(self, token_ids: Sequence[int], num_blocks: int) -> bool:
        """Whether `import_prefix` of `num_blocks` blocks fits without evicting the prompt's
        own cached head (what the pulled blocks continue)."""
        head, _ = self.match_prefix(token_ids)
        idle = sum(1 for b in head if self._ref_counts[b] == 0)
        return self.enable_prefix_caching and num_blocks + idle <= self.num_free_blocks

    def import_prefix(self, token_ids: Sequence[int], start_block: int,
                      num_blocks: int) -> list[int]:
        """Register blocks start_block .. start_block + num_blocks - 1 of the prompt's chain as
        cached here, in free blocks taken now, whose K/V the caller writes (pulled from a peer)
        before any forward pass reads them. They join the free list as the most recently used
        cached blocks (ref count 0, the chain's tail evicted first): the request that pulled
        them hits them when it is allocated, and nothing leaks if it never is. Returns the
        block ids in chain order, -1 where the key is already cached here (nothing to write).
        The caller checked `can_import`."""
        if not self.enable_prefix_caching:
            raise ValueError("importing prefix blocks needs prefix caching")
        bs, cached, keys, lru = self.block_size, self._cached, self._block_keys, self._free_cached
        head, _ = self.match_prefix(token_ids)
        for b in head:  # not evicted for the blocks taken below (can_import counted it)
            if self._ref_counts[b] == 0:
                lru.move_to_end(b)
        parent, wanted = ROOT_HASH, []
        for i in range(start_block + num_blocks):
            key = (parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            parent = hash(key)
            if i >= start_block:
                wanted.append(None if key in cached else key)
        fresh = self._take_blocks(sum(1 for k in wanted if k is not None))
        out, it, events = [], iter(fresh), self.kv_events
        for key in wanted:
            if key is None:
                out.append(-1)
                continue
            block = next(it)
            keys[block] = key
            cached[key] = block
            self._ref_counts[block] = 0
            if events is not None:
                events.append((KV_STORED, MEDIUM_GPU, key))
            out.append(block)
        for block in reversed(fresh):
            lru[block] = None
        for b in reversed(head):  # then the head, block 0 last of all
            if self._ref_counts[b] == 0:
                lru.move_to_end(b)
        return out

    def swap_out(self, seq_id: object, token_ids: Sequence[int]) -> int:
        """Free a preempted sequence, first saving its registered full blocks to host memory,
        pinned until `allocate(seq_id, ...)` takes them back or `release_swapped(seq_id)`.
        `token_ids`: its tokens (at least its registered blocks' worth). Returns the number of
        blocks saved (a prefix of them: host memory full of pins stops it)."""
        if self.host is None:
            raise ValueError("swap_out needs a host tier (num_host_blocks > 0)")
        bs, table = self.block_size, self._tables[seq_id]
        parent = ROOT_HASH
        num_saved = 0
        for i in range(len(self._hashes[seq_id])):
            key = (parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            if self.host.save(key, table[i], pin_for=seq_id) is None:
                break
            num_saved += 1
            parent = hash(key)
        self.free(seq_id)
        return num_saved

    def release_swapped(self, seq_id: object) -> None:
        """A swapped-out sequence left without resuming (aborted): unpin its host blocks."""
        if self.host is not None:
            self.host.release(seq_id)

    def can_allocate_n(self, num_tokens: int) -> bool:
        """`can_allocate` by count: exact when prefix caching is off (nothing can hit)."""
        return num_tokens > 0 and -(-num_tokens // self.block_size) <= self.num_free_blocks

    def allocate_n(self, seq_id: object, num_tokens: int) -> int:
        """`allocate` by count, for a pool with prefix caching off (then the token values never
        matter: no lookup, no registration). Returns 0, as `allocate` does there."""
        if self.enable_prefix_caching:
            raise ValueError("allocate_n needs the token ids when prefix caching is on")
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        if num_tokens < 1:
            raise ValueError(f"sequence {seq_id!r}: cannot allocate an empty sequence")
        num_needed = -(-num_tokens // self.block_size)
        if num_needed > self.num_free_blocks:
            raise NoFreeBlocksError(f"sequence {seq_id!r} needs {num_needed} free blocks, "
                                    f"{self.num_free_blocks} free")
        self._tables[seq_id] = self._take_blocks(num_needed)
        self._num_tokens[seq_id] = num_tokens
        self._hashes[seq_id] = []
        return 0

    def num_append_blocks_needed(self, seq_id: object, num_new_tokens: int) -> int:
        """Free blocks `append_slots(seq_id, num_new_tokens)` would take (CoW included)."""
        n = self._num_tokens[seq_id]
        table = self._tables[seq_id]
        cow = n % self.block_size != 0 and not self._exclusive and self._ref_counts[table[-1]] > 1
        return self.num_blocks_for(n + num_new_tokens) - len(table) + cow

    def can_append_slots(self, seq_id: object, num_new_tokens: int) -> bool:
        return self.num_append_blocks_needed(seq_id, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq_id: object, num_new_tokens: int) -> list[tuple[int, int]]:
        """Grow a sequence by `num_new_tokens` slots; returns CoW copies (src, dst) to perform.

        Copy-on-write: when the last block is partly filled and shared (after `fork`), the
        sequence gets a private copy first; the runner must copy block src into dst (all of
        its filled slots) before writing the new K/V.
        """
        table = self._tables[seq_id]
        n = self._num_tokens[seq_id]
        bs = self.block_size
        if n + num_new_tokens <= len(table) * bs and (n % bs == 0 or self._exclusive
                                                      or self._ref_counts[table[-1]] == 1):
            self._num_tokens[seq_id] = n + num_new_tokens  # fast path: room in a private block
            return []
        num_needed = self.num_append_blocks_needed(seq_id, num_new_tokens)
        if num_needed > self.num_free_blocks:
            raise NoFreeBlocksError(f"sequence {seq_id!r} needs {num_needed} free blocks, "
                                    f"{self.num_free_blocks} free")
        copies: list[tuple[int, int]] = []
        if n % bs and not self._exclusive and self._ref_counts[table[-1]] > 1:
            src = table[-1]
            self._ref_counts[src] -= 1
            table[-1] = self._take_free()
            copies.append((src, table[-1]))
        for _ in range(self.num_blocks_for(n + num_new_tokens) - len(table)):
            table.append(self._take_free())
        self._num_tokens[seq_id] = n + num_new_tokens
        return copies

    # ---- the step scheduler's lazy decodes (scheduler.lazy_decodes) ----------------------------
    # Decoding sequences never share their last block (the scheduler never forks), so these
    # skip the copy-on-write checks of append_slots; the caller has checked the free count.
    def append_block(self, seq_id: object, num_tokens: int) -> None:
        """Add one fresh block to the sequence and set its slot count."""
        self._tables[seq_id].append(self._take_free())
        self._num_tokens[seq_id] = num_tokens

    def append_blocks(self, seq_id: object, num_blocks: int, num_tokens: int) -> None:
        """`append_block` `num_blocks` times for one sequence (the blocks taken in one batch),
        ending at `num_tokens` slots."""
        self._tables[seq_id] += self._take_blocks(num_blocks)
        self._num_tokens[seq_id] = num_tokens

    def append_block_each(self, seq_ids: Sequence[object], num_tokens: Sequence[int]) -> None:
        """`append_block` for every sequence, the blocks taken from the free list in one batch."""
        tables, counts = self._tables, self._num_tokens
        for seq_id, n, block in zip(seq_ids, num_tokens, self._take_blocks(len(seq_ids))):
            tables[seq_id].append(block)
            counts[seq_id] = n

    # ---- speculative decoding: slots for draft tokens, given back after the verify ------------
    def num_reserve_blocks_needed(self, seq_id: object, num_tokens: int) -> int:
        """Fresh blocks `reserve_slots(seq_id, num_tokens)` takes."""
        return max(0, self.num_blocks_for(num_tokens) - len(self._tables[seq_id]))

    def reserve_slots(self, seq_id: object, num_tokens: int) -> None:
        """Grow a decoding sequence's table (never shared: no copy-on-write) to cover
        `num_tokens` slots, the verify's draft tokens included; the caller checked the free
        count (`num_reserve_blocks_needed`)."""
        n = self.num_reserve_blocks_needed(seq_id, num_tokens)
        if n > self.num_free_blocks:
            raise NoFreeBlocksError(f"sequence {seq_id!r} needs {n} free blocks, "
                                    f"{self.num_free_blocks} free")
        if n:
            self._tables[seq_id] += self._take_blocks(n)
        self._num_tokens[seq_id] = num_tokens

    def truncate(self, seq_id: object, num_tokens: int) -> int:
        """Give back the slots past `num_tokens` (a verify's rejected drafts): the blocks that
        hold none of the first `num_tokens` go back to the front of the free list. They were
        never registered (only full blocks of computed tokens are) nor shared. Returns how many
        blocks were freed."""
        table = self._tables[seq_id]
        keep = self.num_blocks_for(num_tokens)
        dropped = table[keep:]
        if not self._exclusive:
            ref, keys = self._ref_counts, self._block_keys
            for block in dropped:
                if ref[block] != 1 or keys[block] is not None:
                    raise ValueError(f"sequence {seq_id!r}: block {block} past its tokens is "
                                     "shared or cached")
            for block in dropped:
                ref[block] = 0
        self._num_tokens[seq_id] = num_tokens
        if not dropped:
            return 0
        del table[keep:]
        self._free_uncached += dropped[::-1]  # the table's first dropped block is taken first
        return len(dropped)

    def set_slot_counts(self, num_tokens: Mapping[object, int]) -> None:
        """Set sequences' slot counts (each already covered by its blocks): seq id -> slots."""
        self._num_tokens.update(num_tokens)

    def block_hashes(self, seq_id: object) -> list[int]:
        """Hashes of the sequence's registered full blocks (read-only)."""
        return self._hashes[seq_id]

    def cache_blocks(self, seq_id: object, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Register the sequence's full blocks among its first `num_computed_tokens` tokens.

        Call after the step that computed them; `token_ids` is the sequence's whole token list.
        A block whose key is already cached (another block holds the same prefix) stays private.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self._hashes[seq_id]
        num_full = num_computed_tokens // bs
        if len(hashes) >= num_full:
            return
        table = self._tables[seq_id]
        if num_full > len(table):
            raise ValueError(f"sequence {seq_id!r}: {num_computed_tokens} tokens computed but "
                             f"{len(table)} blocks")
        parent = hashes[-1] if hashes else ROOT_HASH
        cached, block_keys, events = self._cached, self._block_keys, self.kv_events
        for i in range(len(hashes), num_full):
            key = (parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            block = table[i]
            # a fork may share a block its parent already registered; a key another block
            # holds stays with that block (setdefault leaves it)
            if block_keys[block] is None and cached.setdefault(key, block) == block:
                block_keys[block] = key
                if events is not None:
                    events.append((KV_STORED, MEDIUM_GPU, key))
            parent = hash(key)
            hashes.append(parent)

    def fork(self, parent_id: object, child_id: object) -> None:
        """Give `child_id` the parent's blocks (shared, ref counted); CoW on the next append."""
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r} already has blocks")
        table = self._tables[parent_id]
        if self._exclusive:
            self._leave_exclusive()
        for block in table:
            self._ref_counts[block] += 1
        self._tables[child_id] = list(table)
        self._num_tokens[child_id] = self._num_tokens[parent_id]
        self._hashes[child_id] = list(self._hashes[parent_id])

    def _leave_exclusive(self) -> None:
        """Keep ref counts and block keys from now on (blocks are about to be shared). The counts
        were not kept: every held block has 1; no block was keyed."""
        self._exclusive = False
        ref = self._ref_counts = [0] * self.num_blocks
        if not self._block_keys:
            self._block_keys = [None] * self.num_blocks
        for held in self._tables.values():
            for block in held:
                ref[block] = 1

    def free(self, seq_id: object) -> None:
        """Drop the sequence's references; blocks reaching 0 go back to the free list."""
        if self._pin_wanted and seq_id in self._pin_wanted:
            self._apply_pin(seq_id)
        table = self._tables.pop(seq_id)
        del self._num_tokens[seq_id]
        del self._hashes[seq_id]
        ref, keys = self._ref_counts, self._block_keys
        uncached, cached = self._free_uncached, self._free_cached
        if self._exclusive:  # every block drops to 0 (counts not kept) and none is cached
            uncached += table[::-1]  # a copy: a plan may still hold the live table
            return
        for block in reversed(table):
            n = ref[block] - 1
            ref[block] = n
            if n == 0:
                if keys[block] is None:
                    uncached.append(block)  # to the front
                else:
                    cached[block] = None  # to the back (most recently used)

    # ---- pins: a prefix kept on the GPU for a time (issue 30) ----------------------------------
    @property
    def num_pinned_blocks(self) -> int:
        """Blocks held by pins (each counted once)."""
        return len(self._pin_refs)

    @property
    def num_pins(self) -> int:
        return len(self._pins)

    def pin_status(self) -> dict:
        """What /metrics shows: pins, blocks held and reserved, the budget, refusals, expiries."""
        if self._pin_heap and self._pin_heap[0][0] <= self.pin_clock():
            self.expire_pins()
        return {"pins": len(self._pins), "pinned_blocks": len(self._pin_refs),
                "reserved_blocks": self._pin_reserved, "budget_blocks": self.pin_budget_blocks,
                "refused": self.num_pins_refused, "expired": self.num_pins_expired,
                "yielded": self.num_pins_yielded}

    def _pinned_prefix_blocks(self, token_ids: Sequence[int], num_blocks: int) -> int:
        """How many of the prompt's first `num_blocks` full blocks pins hold already."""
        bs, cached, refs = self.block_size, self._cached, self._pin_refs
        parent, n = ROOT_HASH, 0
        for i in range(num_blocks):
            key = (parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            block = cached.get(key)
            if block is None:
                break
            n += block in refs
            parent = hash(key)
        return n

    def request_pin(self, seq_id: object, token_ids: Sequence[int], num_tokens: int,
                    ttl_s: float) -> bool:
        """Reserve a pin of the sequence's first `num_tokens` tokens (whole blocks) for `ttl_s`
        seconds from when it is freed: True, or False when the budget cannot take the blocks
        not pinned already (the request is then served unpinned). Call before it is freed."""
        if not self.enable_prefix_caching or ttl_s <= 0:
            return False
        num_blocks = min(num_tokens, len(token_ids)) // self.block_size
        if num_blocks < 1:
            return False
        if seq_id in self._pin_wanted:
            self._drop_wanted(seq_id)
        need = num_blocks - self._pinned_prefix_blocks(token_ids, num_blocks)
        if len(self._pin_refs) + self._pin_reserved + need > self.pin_budget_blocks:
            self.num_pins_refused += 1
            return False
        # a request that never runs (aborted while waiting) gives its reservation up by then
        self._pin_wanted[seq_id] = (num_blocks, ttl_s, need, self.pin_clock() + 2 * ttl_s)
        self._pin_reserved += need
        return True

    def _drop_wanted(self, seq_id: object) -> None:
        _, _, need, _ = self._pin_wanted.pop(seq_id)
        self._pin_reserved -= need

    def _apply_pin(self, seq_id: object) -> None:
        """The sequence is being freed: its leading cached blocks (up to the pin's) take a pin
        reference. A sequence freed before its prefix was computed (preempted) keeps its
        reservation for the next time it is freed."""
        num_blocks, ttl_s, _, _ = self._pin_wanted[seq_id]
        hashes, table, keys = self._hashes[seq_id], self._tables[seq_id], self._block_keys
        if len(hashes) < num_blocks:
            return
        self._drop_wanted(seq_id)
        blocks = []
        for block in table[:num_blocks]:
            if keys[block] is None:  # a private copy of a prefix another block holds
                break
            blocks.append(block)
        if not blocks:
            return
        until = self.pin_clock() + ttl_s
        pin_id = hashes[len(blocks) - 1]
        pin = self._pins.get(pin_id)
        if pin is not None and pin[1] == blocks:  # the same prefix again: a refresh
            pin[0] = max(pin[0], until)
        else:
            if pin is not None:
                self._unpin(pin_id)
            refs, ref = self._pin_refs, self._ref_counts
            for block in blocks:
                n = refs.get(block, 0)
                refs[block] = n + 1
                if n == 0:
                    ref[block] += 1  # the sequence still holds it: no free list to leave
            self._pins[pin_id] = [until, blocks]
        heapq.heappush(self._pin_heap, (until, pin_id))

    def _unpin(self, pin_id: int) -> None:
        _, blocks = self._pins.pop(pin_id)
        refs, ref = self._pin_refs, self._ref_counts
        for block in blocks:
            n = refs[block] - 1
            if n:
                refs[block] = n
                continue
            del refs[block]
            ref[block] -= 1
            if ref[block] == 0:  # to the back of the cached LRU, as a freed prefix
                self._free_cached[block] = None

    def _yield_pins(self, need: int) -> None:
        """A request that could never run beside the pins (no sequence holds blocks to free, or
        it needs more than the unpinned pool): pins give way, soonest to expire first, until it
        fits. Their blocks join the cached LRU (to the host tier when evicted, if there is one)."""
        for _, pin_id in sorted((p[0], pid) for pid, p in self._pins.items()):
            if need <= self.num_free_blocks:
                break
            self._unpin(pin_id)
            self.num_pins_yielded += 1

    def expire_pins(self, now: float | None = None) -> int:
        """Drop the pins whose time is up (and reservations never used); returns how many."""
        now = self.pin_clock() if now is None else now
        heap, pins, n = self._pin_heap, self._pins, 0
        while heap and heap[0][0] <= now:
            _, pin_id = heapq.heappop(heap)
            pin = pins.get(pin_id)
            if pin is not None and pin[0] <= now:
                self._unpin(pin_id)
                n += 1
        self.num_pins_expired += n
        if self._pin_wanted:
            for seq_id in [s for s, w in self._pin_wanted.items()
                           if w[3] <= now and s not in self._tables]:
                self._drop_wanted(seq_id)
        return n

    # ---- integrity ---------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise AssertionError naming the first inconsistency found."""
        bs = self.block_size
        counts = [0] * self.num_blocks
        for seq_id, table in self._tables.items():
            assert len(set(table)) == len(table), f"seq {seq_id!r}: a block twice in {table}"
            n = self._num_tokens[seq_id]
            assert self.num_blocks_for(n) == len(table), (
                f"seq {seq_id!r}: {n} slots but {len(table)} blocks")
            assert len(self._hashes[seq_id]) <= n // bs, f"seq {seq_id!r}: hashes past its full blocks"
            for block in table:
                assert 0 <= block < self.num_blocks, f"seq {seq_id!r}: bad block id {block}"
                counts[block] += 1
        for block, n in self._read_refs.items():
            counts[block] += n
            assert self._block_keys[block] is not None, f"read-held block {block} is not cached"
        for block in self._pin_refs:
            counts[block] += 1
            assert self._block_keys[block] is not None, f"pinned block {block} is not cached"
        assert sum(len(p[1]) for p in self._pins.values()) == sum(self._pin_refs.values()), \
            "pin references disagree with the pins"
        assert self._tables.keys() == self._num_tokens.keys() == self._hashes.keys(), \
            "per-sequence maps disagree"
        fresh = range(self._first_fresh, self.num_blocks)
        free = set(self._free_uncached) | set(fresh) | self._free_cached.keys()
        assert len(free) == self.num_free_blocks, "a block twice in the free list"
        refs = self._ref_counts
        if self._exclusive:  # counts not kept: all 0 in the list, 1 for every held block
            assert not refs, "ref counts kept while no block can be shared"
            refs = [1 if c else 0 for c in counts]
        for block, (want, have) in enumerate(zip(counts, refs)):
            assert want == have, f"block {block}: ref count {have} but held by {want} tables"
            assert (have == 0) == (block in free), (
                f"block {block}: ref count {have} but {'in' if block in free else 'not in'} "
                "the free list")
        keys = self._block_keys or [None] * self.num_blocks  # empty: nothing is keyed
        for block in [*self._free_uncached, *fresh]:
            assert keys[block] is None, f"block {block}: cached but in the uncached part"
        for block in self._free_cached:
            assert self._block_keys[block] is not None, f"block {block}: uncached in the LRU part"
        assert len(free) + sum(1 for c in counts if c) == self.num_blocks, "blocks unaccounted"
        for key, block in self._cached.items():
            assert self._block_keys[block] == key, f"cache entry points at block {block} with another key"
        num_keyed = sum(1 for k in self._block_keys if k is not None)
        assert num_keyed == len(self._cached), f"{num_keyed} keyed blocks, {len(self._cached)} cached"
        if not self.enable_prefix_caching:
            assert not self._cached, "prefix caching is off but blocks are cached"
        if self.host is not None:
            self.host.check_integrity()
            swapped = set(self.host.swapped_seq_ids()) & self._tables.keys()
            assert not swapped, f"sequences both swapped out and holding GPU blocks: {swapped}"
            for kind, src, dst in self.host.pending_copies():
                gpu, host = (src, dst) if kind == "d2h" else (dst, src)
                assert 0 <= gpu < self.num_blocks and 0 <= host < self.host.num_blocks, (
                    f"copy {kind} {src}->{dst} out of range")
