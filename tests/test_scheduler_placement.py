"""Placement policies: least-loaded picks against a brute-force reference, prefix hashes equal to
the block manager's, affinity within the load bound, spill-over of a hot prefix, window grouping,
membership (drain/remove), facts replacing guesses."""
from __future__ import annotations

import random

import pytest

from scheduler.block_manager import BlockManager
from scheduler.load_index import LoadIndex
from scheduler.placement import (
    PlacementConfig,
    PlacementItem,
    prefix_hashes,
)
from scheduler.placements import create_placement
from scheduler.prefix_index import DEPTHS, PrefixIndex


def _policy(name: str, num_backends: int = 4, **kw):
    p = create_placement(PlacementConfig(policy=name, **kw))
    for b in range(num_backends):
        p.add_backend(b)
    return p


def _tokens(tenant: int, n: int, tail_seed: int = 0) -> list[int]:
    """A prompt whose first 2/3 is the tenant's system prompt and the rest is unique."""
    head = [1000 * tenant + i for i in range(2 * n // 3)]
    rnd = random.Random(tail_seed)
    return head + [rnd.randrange(10**6, 2 * 10**6) for _ in range(n - len(head))]


# ---- LoadIndex -------------------------------------------------------------------------------
def test_least_matches_brute_force_under_random_operations():
    rnd = random.Random(7)
    idx = LoadIndex()
    ref_load: dict[int, int] = {}
    ref_acc: dict[int, bool] = {}
    for step in range(5000):
        op = rnd.random()
        if op < 0.05 or not ref_load:
            b = rnd.randrange(40)
            if b not in ref_load:
                idx.add(b)
                ref_load[b], ref_acc[b] = 0, True
        elif op < 0.07:
            b = rnd.choice(sorted(ref_load))
            idx.remove(b)
            del ref_load[b], ref_acc[b]
        elif op < 0.15:
            b = rnd.choice(sorted(ref_load))
            ref_acc[b] = not ref_acc[b]
            idx.set_accepting(b, ref_acc[b])
        else:
            b = rnd.choice(sorted(ref_load))
            d = rnd.randrange(-500, 1000)
            ref_load[b] += d
            idx.add_load(b, d)
        cands = [(load, b) for b, load in ref_load.items() if ref_acc[b]]
        want = min(cands)[1] if cands else None
        assert idx.least() == want, f"step {step}"
        assert len(idx._heap) <= 4 * len(ref_load) + 65  # stale entries are bounded


def test_load_index_rejects_duplicates_and_negative_ids():
    idx = LoadIndex()
    idx.add(0)
    with pytest.raises(ValueError):
        idx.add(0)
    with pytest.raises(ValueError):
        idx.add(-1)


# ---- prefix hashes ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 16, 17, 33, 100, 600])
def test_prefix_hashes_are_the_block_managers_chain_hashes(n):
    bs = 16
    toks = list(range(5, 5 + n))
    bm = BlockManager(num_blocks=64, block_size=bs, enable_prefix_caching=True)
    bm.allocate("s", toks)
    bm.cache_blocks("s", toks, n)
    chain = bm.block_hashes("s")            # hash of every full block's key, in order
    got = prefix_hashes(toks, bs)
    usable = (n - 1) // bs               # a cache hit leaves >= 1 token to compute
    want = tuple(chain[d - 1] for d in DEPTHS if d <= usable)
    assert got == want


def test_prefix_hashes_tell_prefixes_apart():
    a, b = _tokens(1, 600), _tokens(2, 600)
    assert prefix_hashes(a, 16)[0] != prefix_hashes(b, 16)[0]
    a2 = _tokens(1, 600, tail_seed=5)
    ha, ha2 = prefix_hashes(a, 16), prefix_hashes(a2, 16)
    assert len(ha) == len(ha2) == len(DEPTHS)
    # 400 shared tokens = 25 full blocks: depths 1..16 agree, depth 32 does not
    assert ha[:5] == ha2[:5] and ha[5] != ha2[5]


# ---- least-tokens ----------------------------------------------------------------------------
def test_least_tokens_balances_and_releases():
    p = _policy("least-tokens", 3)
    items = [PlacementItem(100) for _ in range(6)]
    p.place(items, 0.0)
    assert [it.backend for it in items] == [0, 1, 2, 0, 1, 2]
    assert [p.load(b) for b in range(3)] == [200, 200, 200]
    p.release(1, 200)
    it = PlacementItem(50)
    p.place([it], 0.0)
    assert it.backend == 1 and it.charged == 50


def test_no_accepting_backend_places_nothing():
    p = _policy("prefix", 2)
    p.set_accepting(0, False)
    p.set_accepting(1, False)
    it = PlacementItem(10, prefix_hashes(_tokens(0, 100), 16))
    p.place([it], 0.0)
    assert it.backend == -1 and p.load(0) == p.load(1) == 0


# ---- prefix affinity -------------------------------------------------------------------------
def test_same_prefix_follows_its_first_request_and_is_charged_less():
    p = _policy("prefix", 4, load_slack_tokens=10_000)
    first = PlacementItem(600, prefix_hashes(_tokens(3, 600), 16))
    p.place([first], 0.0)
    others = [PlacementItem(600, prefix_hashes(_tokens(3, 600, s), 16)) for s in range(1, 6)]
    p.place(others, 0.1)
    assert {it.backend for it in others} == {first.backend}
    # 400 shared tokens cover 16 sampled blocks (256 tokens): those are not charged again
    assert first.charged == 600 and all(it.charged == 600 - 256 for it in others)
    # another tenant goes elsewhere (the least-loaded backend)
    other = PlacementItem(600, prefix_hashes(_tokens(4, 600), 16))
    p.place([other], 0.2)
    assert other.backend != first.backend


def test_load_bound_spills_a_hot_prefix_and_keeps_backends_within_it():
    factor, slack = 1.5, 2000
    p = _policy("prefix", 4, load_factor=factor, load_slack_tokens=slack)
    hot = prefix_hashes(_tokens(9, 600), 16)
    placed = []
    for i in range(400):
        it = PlacementItem(600, hot)
        p.place([it], i * 0.01)
        placed.append(it.backend)
        loads = [p.load(b) for b in range(4)]
        assert max(loads) <= min(loads) * factor + slack + 600  # the bound, plus one request
    assert set(placed) == {0, 1, 2, 3}          # the hot prefix spread to every backend
    assert p.num_spilled >= 3


def test_slack_scales_with_the_least_loaded_backends_kv_capacity():
    """One hot prefix on two small backends (tiny-coder's 2,730 blocks of 16 on the CPU): with
    the H200-sized fixed slack (8,192 tokens) it never spills and one backend takes everything;
    with the slack at 4 % of the reported 43,680 KV tokens (1,747) it spreads evenly."""
    def run(capacity: int | None, **kw) -> list[int]:
        p = _policy("prefix", 2, **kw)
        if capacity is not None:
            for b in range(2):
                p.set_capacity(b, capacity)
        hot = prefix_hashes(_tokens(5, 288), 16)
        counts = [0, 0]
        for i in range(150):  # never released: the load only grows (to 7,200 tokens)
            it = PlacementItem(288 + 16, hot)
            p.place([it], i * 0.01)
            counts[it.backend] += 1
        return counts

    assert run(None) == [150, 0]                   # capacity unknown: the fixed 8,192 tokens
    spread = run(2730 * 16)
    assert max(spread) <= 1.5 * min(spread), spread
    assert run(2730 * 16, load_slack_tokens=8192, fixed_slack=True) == [150, 0]
    assert run(0) == [150, 0]                      # reported unknown again: the fixed slack
    with pytest.raises(ValueError):
        PlacementConfig(load_slack_fraction=1.5)


def test_new_prefixes_take_turns_unless_the_next_backend_is_two_requests_busier():
    """Cold prefixes go round the backends while loads are within two requests of each other,
    so which backend takes a new tenant does not hinge on who finished a little sooner."""
    p = _policy("prefix", 3, load_slack_tokens=1000)
    p.charge(0, 550)                            # backend 0 busier, but by less than 2 requests
    firsts = []
    for t in range(3):
        it = PlacementItem(300, prefix_hashes(_tokens(t, 300), 16))
        p.place([it], 0.1 * t)
        firsts.append(it.backend)
        p.release(it.backend, it.charged)       # done at once: only the 550 remain
    assert firsts == [0, 1, 2] and p.num_home == 3
    p.charge(0, 100)                            # now 650 above the others: past two requests
    it = PlacementItem(300, prefix_hashes(_tokens(3, 300), 16))
    p.place([it], 1.0)
    assert it.backend == 1 and p.num_home == 3  # least-loaded (ties: lowest id), no turn taken
    it = PlacementItem(300, prefix_hashes(_tokens(1, 300), 16))
    p.place([it], 1.1)                          # tenant 1 is held by backend 1: affinity
    assert it.backend == 1 and p.num_cold == 4


def test_affinity_ignores_a_holder_that_does_not_accept():
    p = _policy("prefix", 3)
    pre = prefix_hashes(_tokens(1, 300), 16)
    a = PlacementItem(300, pre)
    p.place([a], 0.0)
    p.set_accepting(a.backend, False)           # draining
    b = PlacementItem(300, pre)
    p.place([b], 0.0)
    assert b.backend not in (-1, a.backend)


def test_removed_backend_is_forgotten():
    p = _policy("prefix", 2)
    pre = prefix_hashes(_tokens(1, 300), 16)
    a = PlacementItem(300, pre)
    p.place([a], 0.0)
    p.remove_backend(a.backend)
    assert all(a.backend not in s for s in p.index.holders.values())
    b = PlacementItem(300, pre)
    p.place([b], 0.0)
    assert b.backend == 1 - a.backend


# ---- facts and guesses -----------------------------------------------------------------------
def test_a_report_without_the_prefix_retires_an_old_guess():
    idx = PrefixIndex(guess_ttl_s=1.0)
    idx.add_backend(0)
    idx.guess(0, [11, 12], now=0.0)
    idx.report(0, [], now=0.5)                  # report lags the guess: keep it
    assert idx.holds(0, 11)
    idx.report(0, [11], now=1.5)                # 11 is a fact now; 12 was evicted
    assert idx.holds(0, 11) and not idx.holds(0, 12)
    idx.report(0, [], now=2.0)                  # and now 11 is gone too
    assert not idx.holds(0, 11)
    assert idx.holders == {}


def test_facts_make_a_backend_a_holder_without_guesses():
    p = _policy("prefix", 3)
    pre = prefix_hashes(_tokens(5, 600), 16)
    p.report(2, pre, 0.0)                       # e.g. another gateway sent it there
    it = PlacementItem(600, pre)
    p.place([it], 0.0)
    assert it.backend == 2


def test_guesses_without_reports_are_an_lru():
    idx = PrefixIndex(max_guesses=3)
    idx.add_backend(0)
    for h in range(5):
        idx.guess(0, [h], now=float(h))
    assert [h for h in range(5) if idx.holds(0, h)] == [2, 3, 4]


# ---- window ----------------------------------------------------------------------------------
def test_window_places_same_prefix_groups_together_and_packs_loners():
    p = _policy("window", 4, load_slack_tokens=100_000)
    window = []
    for i in range(12):
        tenant = i % 3
        window.append(PlacementItem(600, prefix_hashes(_tokens(tenant, 600, i), 16), payload=tenant))
    loners = [PlacementItem(c) for c in (50, 400, 100, 300)]
    p.place(window + loners, 0.0)
    by_tenant: dict[int, set[int]] = {}
    for it in window:
        by_tenant.setdefault(it.payload, set()).add(it.backend)
    assert all(len(s) == 1 for s in by_tenant.values())        # each group on one backend
    assert len({next(iter(s)) for s in by_tenant.values()}) == 3  # three groups, three backends
    assert all(it.backend >= 0 for it in loners)
    # the loners fill the backend no group took first, largest first
    assert loners[1].backend == ({0, 1, 2, 3} - {next(iter(s)) for s in by_tenant.values()}).pop()


def test_window_of_one_hot_prefix_still_respects_the_bound():
    p = _policy("window", 4, load_factor=1.25, load_slack_tokens=1000)
    hot = prefix_hashes(_tokens(9, 600), 16)
    window = [PlacementItem(600, hot) for _ in range(64)]
    p.place(window, 0.0)
    loads = [p.load(b) for b in range(4)]
    assert max(loads) <= min(loads) * 1.25 + 1000 + 600


def test_config_rejects_unknown_policy_and_bad_bounds():
    with pytest.raises(ValueError, match="unknown placement policy"):
        PlacementConfig(policy="random")
    with pytest.raises(ValueError):
        PlacementConfig(load_factor=0.5)


# ---- the backend's summary -------------------------------------------------------------------
def test_summary_reports_what_the_block_manager_still_caches():
    from scheduler.prefix_index import PrefixSummary
    bs = 4
    bm = BlockManager(num_blocks=12, block_size=bs, enable_prefix_caching=True)
    summary = PrefixSummary(bs)
    a = list(range(100, 121))             # 21 tokens: 5 usable full blocks -> depths 1, 2, 4
    summary.add_prompt(a)
    bm.allocate("a", a)
    bm.cache_blocks("a", a, len(a))
    want_a = list(reversed(prefix_hashes(a, bs)))
    assert summary.snapshot(bm.is_cached) == want_a
    bm.free("a")                          # freed but cached: still held
    assert summary.snapshot(bm.is_cached) == want_a
    b = list(range(500, 545))             # 45 tokens = 12 blocks: evicts every cached block of a
    summary.add_prompt(b)
    bm.allocate("b", b)
    bm.cache_blocks("b", b, len(b))
    assert summary.snapshot(bm.is_cached) == list(reversed(prefix_hashes(b, bs)))


def test_summary_reports_a_prompt_until_it_is_prefilled_then_only_while_cached():
    """A prompt admitted but not yet prefilled has no cached block: it is reported anyway (for
    up to `pending_snapshots` reports), so the gateway's guess does not lapse while it waits;
    once its blocks were cached, an eviction forgets it at the next report."""
    from scheduler.prefix_index import PrefixSummary
    bs = 4
    bm = BlockManager(num_blocks=12, block_size=bs, enable_prefix_caching=True)
    summary = PrefixSummary(bs, pending_snapshots=3)
    a = list(range(100, 121))
    want_a = list(reversed(prefix_hashes(a, bs)))
    summary.add_prompt(a)                        # admitted, waiting: nothing cached yet
    assert summary.snapshot(bm.is_cached) == want_a
    assert summary.snapshot(bm.is_cached) == want_a
    assert summary.snapshot(bm.is_cached) == want_a
    assert summary.snapshot(bm.is_cached) == []  # never prefilled within 3 reports: dropped
    summary.add_prompt(a)                        # again, and this time it runs
    bm.allocate("a", a)
    bm.cache_blocks("a", a, len(a))
    bm.free("a")
    assert summary.snapshot(bm.is_cached) == want_a
    b = list(range(500, 545))                    # evicts a's blocks
    bm.allocate("b", b)
    bm.cache_blocks("b", b, len(b))
    assert summary.snapshot(bm.is_cached) == []  # a was confirmed cached: gone at once
