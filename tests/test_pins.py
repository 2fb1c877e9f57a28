"""Prefix pins with a time to live (issue 30): pinned blocks survive pressure, expire on time,
stay within the budget, and then leave like any cached prefix (to the host tier when there is one)."""
from scheduler.block_manager import BlockManager


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _bm(num_blocks=16, budget=8, host=0):
    bm = BlockManager(num_blocks, 4, True, num_host_blocks=host)
    bm.pin_budget_blocks = budget
    bm.pin_clock = clock = Clock()
    return bm, clock


def _run(bm, seq, tokens):
    """Allocate, 'compute' and free one sequence; returns the tokens it found cached."""
    hit = bm.allocate(seq, tokens)
    bm.cache_blocks(seq, tokens, len(tokens))
    bm.free(seq)
    return hit


def _pressure(bm, first_seq, n):
    """Unrelated prompts that need the whole pool, one after another."""
    for k in range(n):
        _run(bm, f"p{first_seq}-{k}", list(range(10_000 + 100 * k, 10_000 + 100 * k + 4 * bm.num_blocks - 1)))


def test_pinned_prefix_survives_pressure_and_unpinned_is_evicted():
    bm, clock = _bm()
    pinned, other = list(range(17)), list(range(500, 517))
    bm.allocate("a", pinned)
    assert bm.request_pin("a", pinned, 16, ttl_s=60.0)
    bm.cache_blocks("a", pinned, 17)
    bm.free("a")
    _run(bm, "b", other)
    assert bm.num_pinned_blocks == 4
    clock.t = 30.0
    evictions = bm.num_evictions
    # 12 free blocks left: prompts of 11 blocks evict everything unpinned
    for k in range(3):
        _run(bm, f"p{k}", list(range(10_000 + 100 * k, 10_000 + 100 * k + 44)))
    assert bm.num_evictions > evictions
    assert _run(bm, "b2", other) == 0               # the unpinned prefix was evicted
    assert _run(bm, "a2", pinned) == 16             # the pinned one was not
    bm.check_integrity()


def test_pin_expires_on_time_then_is_evictable():
    bm, clock = _bm()
    pinned = list(range(17))
    bm.allocate("a", pinned)
    assert bm.request_pin("a", pinned, 16, ttl_s=10.0)
    bm.cache_blocks("a", pinned, 17)
    bm.free("a")
    free_pinned = bm.num_free_blocks
    clock.t = 9.99
    assert bm.num_pins == 1 and bm.num_free_blocks == free_pinned
    clock.t = 10.0
    assert bm.num_free_blocks == free_pinned + 4     # expired: the blocks are free (cached) again
    assert bm.num_pins == 0 and bm.num_pins_expired == 1
    for k in range(3):
        _run(bm, f"p{k}", list(range(10_000 + 100 * k, 10_000 + 100 * k + 60)))
    assert _run(bm, "a2", pinned) == 0
    bm.check_integrity()


def test_refresh_extends_and_budget_refuses():
    bm, clock = _bm(budget=5)
    pinned = list(range(17))
    bm.allocate("a", pinned)
    assert bm.request_pin("a", pinned, 16, ttl_s=10.0)
    bm.cache_blocks("a", pinned, 17)
    bm.free("a")
    clock.t = 8.0
    bm.allocate("a2", pinned)                          # the same prefix again: refreshes
    assert bm.request_pin("a2", pinned, 16, ttl_s=10.0)  # needs no new block
    bm.cache_blocks("a2", pinned, 17)
    bm.free("a2")
    clock.t = 17.0
    assert bm.num_pins == 1 and bm.num_pinned_blocks == 4
    other = list(range(900, 917))
    bm.allocate("c", other)
    assert not bm.request_pin("c", other, 16, ttl_s=10.0)   # 4 + 4 > 5: served unpinned
    assert bm.num_pins_refused == 1
    bm.cache_blocks("c", other, 17)
    bm.free("c")
    assert bm.num_pinned_blocks == 4
    clock.t = 18.0
    assert bm.num_free_blocks == 16 and bm.num_pins == 0
    bm.check_integrity()


def test_expired_pin_goes_to_host_tier_when_evicted():
    bm, clock = _bm(host=8)
    pinned = list(range(17))
    bm.allocate("a", pinned)
    assert bm.request_pin("a", pinned, 16, ttl_s=5.0)
    bm.cache_blocks("a", pinned, 17)
    bm.free("a")
    clock.t = 6.0
    _run(bm, "p", list(range(10_000, 10_064)))        # the whole pool: evicts the prefix
    assert bm.num_evictions >= 4
    hit = _run(bm, "a2", pinned)
    assert hit == 16 and bm.num_host_hit_tokens == 16   # copied back from host memory, not lost
    bm.check_integrity()


def test_aborted_before_prefill_gives_reservation_back():
    bm, clock = _bm(budget=4)
    prompt = list(range(17))
    assert bm.request_pin("w", prompt, 16, ttl_s=5.0)   # reserved while waiting, never allocated
    assert not bm.request_pin("x", list(range(50, 67)), 16, ttl_s=5.0)
    clock.t = 10.0
    bm.expire_pins()
    assert bm.request_pin("y", list(range(50, 67)), 16, ttl_s=5.0)


def test_pins_yield_to_a_request_that_could_never_run_beside_them():
    bm, _ = _bm(num_blocks=16, budget=8)
    pinned = list(range(29))                       # 7 full blocks pinned
    bm.allocate("a", pinned)
    assert bm.request_pin("a", pinned, 28, ttl_s=60.0)
    bm.cache_blocks("a", pinned, 29)
    bm.free("a")
    assert bm.num_pinned_blocks == 7
    big = list(range(1000, 1000 + 12 * 4))         # 12 blocks > 16 - 7: waits for ever otherwise
    assert bm.can_allocate(big)
    assert bm.num_pins == 0 and bm.num_pins_yielded == 1
    bm.allocate("big", big)
    bm.check_integrity()
