"""BlockManager: unit cases and a hypothesis state machine with named invariant helpers."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduler.block_manager import ROOT_HASH, BlockManager, NoFreeBlocksError


# ---- named invariant helpers -----------------------------------------------------------------
def assert_no_leak(bm: BlockManager) -> None:
    """Every block is either free or held by a table."""
    held = {b for seq in bm.seq_ids() for b in bm.block_table(seq)}
    assert len(held) + bm.num_free_blocks == bm.num_blocks
    assert not held & set(bm.free_list())


def assert_shared_blocks_counted(bm: BlockManager) -> None:
    """A block in k tables has ref count k."""
    holders: dict[int, int] = {}
    for seq in bm.seq_ids():
        for b in bm.block_table(seq):
            holders[b] = holders.get(b, 0) + 1
    for b in range(bm.num_blocks):
        assert bm.ref_count(b) == holders.get(b, 0), f"block {b}"


def assert_all_returned(bm: BlockManager) -> None:
    """With no sequence left, every block is free (cached or not)."""
    assert bm.num_used_blocks == 0
    assert sorted(bm.free_list()) == list(range(bm.num_blocks))
    assert bm.internal_fragmentation() == 0.0


def assert_cache_points_at_computed_prefixes(bm: BlockManager, contents: dict[int, tuple]) -> None:
    """Every cached block holds exactly the tokens its key names (as the model would have them)."""
    for key, block in bm.cached_prefixes().items():
        assert contents.get(block) == key[1], f"cached block {block} holds other tokens"


# ---- unit cases ----------------------------------------------------------------------------------
def test_import_is_pure():
    code = ("import sys, scheduler.block_manager, scheduler.step_scheduler;"
            "bad = {'torch', 'asyncio', 'zmq', 'numpy'} & set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_allocate_and_free_roundtrip():
    bm = BlockManager(8, block_size=4)
    assert bm.can_allocate(list(range(10)))
    assert bm.allocate("a", list(range(10))) == 0
    assert bm.block_table("a") == [0, 1, 2]
    assert bm.num_used_blocks == 3 and bm.num_free_blocks == 5
    assert bm.internal_fragmentation() == pytest.approx(2 / 12)
    bm.free("a")
    bm.check_integrity()
    assert_all_returned(bm)


def test_prefix_hit_needs_computed_blocks_and_leaves_last_token():
    bm = BlockManager(16, block_size=4)
    prompt = list(range(12))
    bm.allocate("a", prompt)
    assert bm.allocate("b", prompt) == 0  # nothing computed yet: no hit
    bm.cache_blocks("a", prompt, 12)
    # full prompt cached, but the last token must be computed: 2 blocks hit, not 3
    assert bm.allocate("c", prompt) == 8
    assert bm.block_table("c")[:2] == bm.block_table("a")[:2]
    assert bm.ref_count(bm.block_table("a")[0]) == 2
    assert bm.allocate("d", prompt + [99]) == 12
    assert bm.num_hit_tokens == 20 and bm.num_query_tokens == 12 * 3 + 13
    bm.check_integrity()


def test_hit_on_free_cached_block_takes_it_back_from_free_list():
    bm = BlockManager(4, block_size=2)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.cache_blocks("a", [1, 2, 3, 4, 5], 5)
    bm.free("a")
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 4
    # needs 3 blocks; 2 are free cached hits -> 3 free entries needed
    assert bm.num_blocks_needed([1, 2, 3, 4, 9]) == 3
    assert bm.allocate("b", [1, 2, 3, 4, 9]) == 4
    assert bm.num_free_blocks == 1
    bm.check_integrity()


def test_different_prefix_same_block_tokens_do_not_hit():
    bm = BlockManager(8, block_size=2)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.cache_blocks("a", [1, 2, 3, 4, 5], 5)
    assert bm.allocate("b", [9, 9, 3, 4, 5]) == 0  # block 2 equal, parent differs


def test_lru_eviction_order():
    bm = BlockManager(4, block_size=2)
    for name, toks in (("a", [1, 1, 0]), ("b", [2, 2, 0])):
        bm.allocate(name, toks)
        bm.cache_blocks(name, toks, 3)
    a0, b0 = bm.block_table("a")[0], bm.block_table("b")[0]
    bm.free("a")  # a's cached block: back of the list; its partial block: front
    bm.free("b")
    order = bm.free_list()
    assert order.index(a0) < order.index(b0)  # a freed first: evicted first
    assert a0 not in order[:2] and b0 not in order[:2]  # uncached blocks are taken first
    # taking 3 fresh blocks uses the two uncached ones, then evicts a's block, keeps b's
    bm.allocate("c", [7, 7, 7, 7, 7, 7])
    assert a0 in bm.block_table("c") and b0 not in bm.block_table("c")
    assert bm.num_evictions == 1
    bm.free("c")
    assert bm.allocate("d", [2, 2, 5]) == 2  # b's prefix survived
    bm.check_integrity()


def test_fork_and_copy_on_write():
    bm = BlockManager(8, block_size=4)
    bm.allocate("p", list(range(6)))  # blocks [x (full), y (2 of 4)]
    bm.fork("p", "c")
    x, y = bm.block_table("p")
    assert bm.ref_count(x) == 2 and bm.ref_count(y) == 2
    bm.check_integrity()
    copies = bm.append_slots("c", 1)
    assert len(copies) == 1 and copies[0][0] == y
    new = copies[0][1]
    assert bm.block_table("c") == [x, new] and bm.block_table("p") == [x, y]
    assert bm.ref_count(y) == 1 and bm.ref_count(new) == 1
    assert bm.append_slots("p", 1) == []  # now private
    bm.check_integrity()
    bm.free("p")
    bm.free("c")
    assert_all_returned(bm)


def test_append_on_full_shared_block_needs_no_copy():
    bm = BlockManager(8, block_size=4)
    bm.allocate("p", list(range(8)))
    bm.fork("p", "c")
    assert bm.append_slots("c", 1) == []
    assert bm.block_table("c")[:2] == bm.block_table("p")
    bm.check_integrity()


def test_shortage_raises_and_changes_nothing():
    bm = BlockManager(2, block_size=4)
    bm.allocate("a", list(range(8)))
    assert not bm.can_allocate([1])
    with pytest.raises(NoFreeBlocksError):
        bm.allocate("b", [1])
    assert not bm.can_append_slots("a", 1)
    with pytest.raises(NoFreeBlocksError):
        bm.append_slots("a", 1)
    assert bm.num_tokens("a") == 8 and "b" not in bm
    bm.check_integrity()


def test_prefix_caching_off():
    bm = BlockManager(8, block_size=2, enable_prefix_caching=False)
    bm.allocate("a", [1, 2, 3])
    bm.cache_blocks("a", [1, 2, 3], 3)
    assert bm.num_cached_blocks == 0 and bm.allocate("b", [1, 2, 3]) == 0
    assert bm.prefix_hit_rate == 0.0


def test_check_integrity_catches_corruption():
    bm = BlockManager(4, block_size=2)
    bm.allocate("a", [1, 2, 3])
    bm._ref_counts[bm.block_table("a")[0]] += 1
    with pytest.raises(AssertionError, match="ref count 2 but held by 1"):
        bm.check_integrity()
    bm = BlockManager(4, block_size=2)
    bm.allocate("a", [1, 2, 3])
    bm._free_uncached.append(bm.block_table("a")[0])
    with pytest.raises(AssertionError, match="free list"):
        bm.check_integrity()
    bm = BlockManager(4, block_size=2)
    bm.allocate("a", [1, 2, 3])
    bm.cache_blocks("a", [1, 2, 3], 3)
    bm._block_keys[bm.block_table("a")[0]] = None
    with pytest.raises(AssertionError, match="cache entry"):
        bm.check_integrity()


def test_bad_arguments():
    with pytest.raises(ValueError):
        BlockManager(0)
    bm = BlockManager(4, block_size=2)
    with pytest.raises(ValueError, match="empty"):
        bm.allocate("a", [])
    assert not bm.can_allocate([])
    bm.allocate("a", [1])
    with pytest.raises(ValueError, match="already"):
        bm.allocate("a", [1])
    with pytest.raises(ValueError, match="already"):
        bm.fork("a", "a")


# ---- hypothesis state machine --------------------------------------------------------------------
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=14)  # tiny alphabet: many shared prefixes


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / append / compute / fork / free against a model of the token contents."""

    @initialize(num_blocks=st.integers(1, 12), block_size=st.integers(1, 4), caching=st.booleans())
    def setup(self, num_blocks, block_size, caching):
        self.bm = BlockManager(num_blocks, block_size, caching)
        self.tokens: dict[str, list[int]] = {}  # slots' tokens per sequence
        self.contents: dict[int, tuple] = {}  # block -> tokens "written" there (computed)
        self.n = 0

    def _write(self, seq: str) -> None:
        """Pretend the runner computed every slot: record what each full block now holds."""
        bs = self.bm.block_size
        toks = self.tokens[seq]
        for i, b in enumerate(self.bm.block_table(seq)):
            chunk = tuple(toks[i * bs:(i + 1) * bs])  # partly filled for the last block
            if self.bm.ref_count(b) > 1:  # a shared block must never change (CoW)
                assert self.contents[b] == chunk, f"shared block {b} overwritten"
            self.contents[b] = chunk

    @rule(tokens=TOKENS)
    def allocate(self, tokens):
        seq = f"s{self.n}"
        self.n += 1
        can = self.bm.can_allocate(tokens)
        free_before = self.bm.num_free_blocks
        if not can:
            with pytest.raises(NoFreeBlocksError):
                self.bm.allocate(seq, tokens)
            assert self.bm.num_free_blocks == free_before
            return
        cached = self.bm.allocate(seq, tokens)
        bs = self.bm.block_size
        assert cached % bs == 0 and 0 <= cached <= len(tokens) - 1
        for i in range(cached // bs):  # hits really hold these tokens
            assert self.contents[self.bm.block_table(seq)[i]] == tuple(tokens[i * bs:(i + 1) * bs])
        self.tokens[seq] = list(tokens)
        self._write(seq)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), new=TOKENS)
    def append(self, data, new):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        if not self.bm.can_append_slots(seq, len(new)):
            with pytest.raises(NoFreeBlocksError):
                self.bm.append_slots(seq, len(new))
            return
        before = list(self.bm.block_table(seq))
        copies = self.bm.append_slots(seq, len(new))
        for src, dst in copies:  # the runner's copy
            assert before[-1] == src and self.bm.block_table(seq)[len(before) - 1] == dst
            if src in self.contents:
                self.contents[dst] = self.contents[src]
        self.tokens[seq].extend(new)
        self._write(seq)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def cache(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.bm.cache_blocks(seq, self.tokens[seq], len(self.tokens[seq]))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = f"s{self.n}"
        self.n += 1
        self.bm.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.bm.free(seq)
        del self.tokens[seq]

    @invariant()
    def integrity(self):
        if not hasattr(self, "bm"):
            return
        self.bm.check_integrity()
        assert_no_leak(self.bm)
        assert_shared_blocks_counted(self.bm)
        assert_cache_points_at_computed_prefixes(self.bm, self.contents)
        for seq, toks in self.tokens.items():
            assert self.bm.num_tokens(seq) == len(toks)
        assert 0.0 <= self.bm.internal_fragmentation() < 1.0

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for seq in list(self.tokens):
            self.bm.free(seq)
        self.bm.check_integrity()
        assert_all_returned(self.bm)


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 12)), max_size=40))
def test_count_only_allocation_equals_token_allocation_when_caching_is_off(ops):
    """allocate_n(seq, n) leaves the same tables, free list and counters as allocate(seq, tokens)."""
    by_tokens = BlockManager(10, block_size=3, enable_prefix_caching=False)
    by_count = BlockManager(10, block_size=3, enable_prefix_caching=False)
    live: list[str] = []
    for i, (alloc, n) in enumerate(ops):
        if alloc or not live:
            tokens = [i % 2] * n
            assert by_count.can_allocate_n(n) == by_tokens.can_allocate(tokens)
            if not by_tokens.can_allocate(tokens):
                with pytest.raises(NoFreeBlocksError):
                    by_count.allocate_n(f"s{i}", n)
                continue
            assert by_count.allocate_n(f"s{i}", n) == by_tokens.allocate(f"s{i}", tokens) == 0
            live.append(f"s{i}")
        else:
            seq = live.pop(n % len(live))
            by_tokens.free(seq)
            by_count.free(seq)
        by_count.check_integrity()
        assert by_count.free_list() == by_tokens.free_list()
        assert {s: by_count.block_table(s) for s in live} == {s: by_tokens.block_table(s) for s in live}
        assert [by_count.num_tokens(s) for s in live] == [by_tokens.num_tokens(s) for s in live]
        assert by_count.prefix_hit_rate == by_tokens.prefix_hit_rate == 0.0


def test_allocate_n_needs_caching_off():
    with pytest.raises(ValueError, match="token ids"):
        BlockManager(4, block_size=2).allocate_n("a", 3)
    bm = BlockManager(4, block_size=2, enable_prefix_caching=False)
    assert not bm.can_allocate_n(0) and not bm.can_allocate_n(9) and bm.can_allocate_n(8)
    with pytest.raises(ValueError, match="empty"):
        bm.allocate_n("a", 0)
    bm.allocate_n("a", 3)
    with pytest.raises(ValueError, match="already"):
        bm.allocate_n("a", 1)


def test_free_without_sharing_matches_the_general_path():
    """Caching off and never forked takes free's no-sharing path; a fork turns it off for good."""
    fast, slow = BlockManager(12, block_size=2, enable_prefix_caching=False), BlockManager(12, block_size=2)
    for bm in (fast, slow):
        bm.allocate("a", [1, 2, 3, 4, 5])
        bm.allocate("b", [6, 7, 8])
        bm.free("a")
    assert fast._exclusive and fast.free_list() == slow.free_list()
    fast.fork("b", "c")
    assert not fast._exclusive
    fast.free("b")
    assert fast.block_table("c") == [3, 4] and fast.ref_count(3) == 1
    fast.free("c")
    fast.check_integrity()
    assert_all_returned(fast)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("aaxfk"), st.integers(0, 5), st.integers(1, 9)),
                    max_size=40), block_size=st.integers(1, 4))
def test_exclusive_pool_keeps_no_ref_counts_but_behaves_as_counted(ops, block_size):
    """Caching off, never forked: the ref counts are not kept (an empty list) yet ref_count,
    CoW checks and integrity read as if every held block had 1; a fork rebuilds the counts."""
    fast = BlockManager(24, block_size, enable_prefix_caching=False)
    slow = BlockManager(24, block_size, enable_prefix_caching=False)
    slow._leave_exclusive()  # the general path: counts kept from the start
    n = 0
    for op, s, k in ops:
        sid = f"s{s}"
        copies = []
        for bm in (fast, slow):
            if op == "a" and sid not in bm and bm.can_allocate_n(k):
                bm.allocate_n(sid, k)
            elif op == "x" and sid in bm and bm.can_append_slots(sid, k):
                copies.append(bm.append_slots(sid, k))
            elif op == "f" and sid in bm:
                bm.free(sid)
            elif op == "k" and sid in bm:
                bm.fork(sid, f"c{n}")
        if op == "k":
            n += 1
        assert not copies or copies[0] == copies[1]
        if fast._exclusive:
            assert not any(fast._ref_counts)
        for bm in (fast, slow):
            bm.check_integrity()
        assert ({s: fast.block_table(s) for s in fast.seq_ids()}
                == {s: slow.block_table(s) for s in slow.seq_ids()}) and fast.free_list() == slow.free_list()
        assert [fast.ref_count(b) for b in range(24)] == [slow.ref_count(b) for b in range(24)]
        assert fast.internal_fragmentation() == slow.internal_fragmentation()
        for sid in fast.seq_ids():
            assert fast.num_append_blocks_needed(sid, 3) == slow.num_append_blocks_needed(sid, 3)


# ---- two tiers: GPU pool + host tier ---------------------------------------------------------------
def apply_copies(bm: BlockManager, gpu: dict[int, tuple], host: dict[int, tuple]) -> None:
    """The runner's part: perform the queued tier copies in order on a model of the contents."""
    for kind, src, dst in bm.host.take_copies():
        if kind == "d2h":
            host[dst] = gpu[src]
        else:
            gpu[dst] = host[src]


def assert_host_holds_its_keys(bm: BlockManager, host: dict[int, tuple]) -> None:
    """Every host block named in the host cache holds the tokens of its key."""
    for key, block in bm.host._cached.items():
        assert host.get(block) == key[1], f"host block {block} holds other tokens"


def test_evicted_prefix_comes_back_from_host():
    bm = BlockManager(3, block_size=2, num_host_blocks=4)
    gpu: dict[int, tuple] = {}
    host: dict[int, tuple] = {}
    bm.allocate("a", [1, 2, 3, 4, 5])
    for i, b in enumerate(bm.block_table("a")):
        gpu[b] = tuple([1, 2, 3, 4, 5][2 * i:2 * i + 2])
    bm.cache_blocks("a", [1, 2, 3, 4, 5], 5)
    bm.free("a")
    assert bm.allocate("b", [9, 9, 9, 9, 9]) == 0  # evicts a's two cached blocks -> host
    assert [c[0] for c in bm.host.pending_copies()] == ["d2h", "d2h"]
    apply_copies(bm, gpu, host)
    assert bm.is_cached((ROOT_HASH, (1, 2)))  # placement still sees the prefix (in host memory)
    assert (ROOT_HASH, (1, 2)) not in bm.cached_prefixes()
    bm.free("b")
    assert bm.allocate("c", [1, 2, 3, 4, 7]) == 4  # both blocks back from the host
    copies = bm.host.take_copies()
    assert [c[0] for c in copies] == ["h2d", "h2d"]
    for _, src, dst in copies:
        gpu[dst] = host[src]
    assert [gpu[b] for b in bm.block_table("c")[:2]] == [(1, 2), (3, 4)]
    assert bm.num_host_hit_tokens == 4
    bm.check_integrity()


def test_swapped_sequence_resumes_with_its_blocks_pinned():
    bm = BlockManager(4, block_size=2, num_host_blocks=2)
    toks = [1, 2, 3, 4, 5]
    bm.allocate("a", toks)
    bm.cache_blocks("a", toks, 5)
    assert bm.swap_out("a", toks) == 2
    assert bm.host.num_pinned_blocks == 2 and "a" not in bm
    bm.check_integrity()
    # other traffic evicts everything on the GPU, and cannot take the pinned host blocks
    bm.allocate("b", [7, 7, 7, 7, 7, 7, 7, 7])
    bm.free("b")
    assert bm.allocate("a", toks) == 4  # resumed: only the last token is computed
    assert bm.host.num_pinned_blocks == 0
    bm.check_integrity()


def test_host_hits_are_not_dropped_by_the_evictions_of_their_own_allocation():
    """A full host tier: the GPU blocks taken for a host hit evict cached GPU blocks, whose saves
    must not take the very host blocks the hit is about to copy back."""
    bm = BlockManager(3, block_size=2, num_host_blocks=2)
    gpu: dict[int, tuple] = {}
    host: dict[int, tuple] = {}

    def run(seq, toks):
        cached = bm.allocate(seq, toks)
        apply_copies(bm, gpu, host)
        for i, b in enumerate(bm.block_table(seq)):
            if i >= cached // 2:  # the forward pass writes what was not a hit
                gpu[b] = tuple(toks[2 * i:2 * i + 2])
        bm.cache_blocks(seq, toks, len(toks))
        return cached

    run("a", [1, 2, 3, 4, 5])
    bm.free("a")
    run("b", [6, 7, 8, 9, 10])  # evicts a's prefix to the host, which is then full
    bm.free("b")
    assert run("c", [1, 2, 3, 4, 9]) == 4  # a's prefix from the host, b's blocks evicted meanwhile
    assert [gpu[b] for b in bm.block_table("c")[:2]] == [(1, 2), (3, 4)]
    assert_host_holds_its_keys(bm, host)
    bm.check_integrity()


def test_host_hits_recomputed_when_the_rule_says_so():
    bm = BlockManager(3, block_size=2, num_host_blocks=4)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.cache_blocks("a", [1, 2, 3, 4, 5], 5)
    bm.free("a")
    bm.allocate("b", [9, 9, 9, 9, 9])  # a's prefix to the host
    bm.free("b")
    bm.host.take_copies()
    bm.load_host_hits = False  # copying back costs more than prefilling (SwapCostModel.should_load)
    assert bm.allocate("c", [1, 2, 3, 4, 7]) == 0
    assert all(kind == "d2h" for kind, _, _ in bm.host.take_copies())
    bm.check_integrity()


def test_host_tier_needs_prefix_caching():
    with pytest.raises(ValueError):
        BlockManager(4, 2, enable_prefix_caching=False, num_host_blocks=2)


class TwoTierMachine(RuleBasedStateMachine):
    """Allocate / append / compute / free / swap out / resume / abort, with evictions to a host
    tier and copies performed in queue order, against a model of both tiers' contents."""

    @initialize(num_blocks=st.integers(1, 10), block_size=st.integers(1, 3),
                num_host_blocks=st.integers(1, 8))
    def setup(self, num_blocks, block_size, num_host_blocks):
        self.bm = BlockManager(num_blocks, block_size, True, num_host_blocks)
        self.tokens: dict[str, list[int]] = {}  # running sequences
        self.swapped: dict[str, tuple[list[int], int]] = {}  # id -> (tokens, blocks saved)
        self.gpu: dict[int, tuple] = {}
        self.host: dict[int, tuple] = {}
        self.n = 0

    def _write(self, seq: str) -> None:
        bs, toks = self.bm.block_size, self.tokens[seq]
        for i, b in enumerate(self.bm.block_table(seq)):
            self.gpu[b] = tuple(toks[i * bs:(i + 1) * bs])

    def _admit(self, seq: str, tokens: list[int]) -> int | None:
        if not self.bm.can_allocate(tokens):
            with pytest.raises(NoFreeBlocksError):
                self.bm.allocate(seq, tokens)
            return None
        cached = self.bm.allocate(seq, tokens)
        apply_copies(self.bm, self.gpu, self.host)  # before the forward pass writes
        bs = self.bm.block_size
        for i in range(cached // bs):  # hits (GPU or host) really hold these tokens
            assert self.gpu[self.bm.block_table(seq)[i]] == tuple(tokens[i * bs:(i + 1) * bs])
        self.tokens[seq] = list(tokens)
        self._write(seq)
        return cached

    @rule(tokens=TOKENS)
    def allocate(self, tokens):
        self.n += 1
        self._admit(f"s{self.n}", tokens)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), new=TOKENS)
    def append(self, data, new):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        if not self.bm.can_append_slots(seq, len(new)):
            return
        assert self.bm.append_slots(seq, len(new)) == []  # never forked: no CoW
        apply_copies(self.bm, self.gpu, self.host)
        self.tokens[seq].extend(new)
        self._write(seq)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def cache(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.bm.cache_blocks(seq, self.tokens[seq], len(self.tokens[seq]))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.bm.free(seq)
        del self.tokens[seq]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def swap_out(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        toks = self.tokens.pop(seq)
        saved = self.bm.swap_out(seq, toks)
        assert 0 <= saved <= len(toks) // self.bm.block_size
        apply_copies(self.bm, self.gpu, self.host)
        if saved:
            self.swapped[seq] = (toks, saved)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def resume(self, data):
        seq = data.draw(st.sampled_from(sorted(self.swapped)))
        toks, saved = self.swapped[seq]
        cached = self._admit(seq, toks)
        if cached is None:
            return  # still waiting; its pins hold
        del self.swapped[seq]
        bs = self.bm.block_size
        # pinned blocks cannot have been dropped: the resume hits all of them
        assert cached >= min(saved, (len(toks) - 1) // bs) * bs

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def abort_swapped(self, data):
        seq = data.draw(st.sampled_from(sorted(self.swapped)))
        self.bm.release_swapped(seq)
        del self.swapped[seq]

    @invariant()
    def integrity(self):
        if not hasattr(self, "bm"):
            return
        self.bm.check_integrity()
        assert not self.bm.host.pending_copies()  # every rule ran its copies
        assert_no_leak(self.bm)
        assert_cache_points_at_computed_prefixes(self.bm, self.gpu)
        assert_host_holds_its_keys(self.bm, self.host)
        assert set(self.bm.host.swapped_seq_ids()) == set(self.swapped)

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for seq in list(self.tokens):
            self.bm.free(seq)
        for seq in list(self.swapped):
            self.bm.release_swapped(seq)
        self.bm.check_integrity()
        assert_all_returned(self.bm)
        assert self.bm.host.num_pinned_blocks == 0


TestTwoTierMachine = TwoTierMachine.TestCase
TestTwoTierMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
