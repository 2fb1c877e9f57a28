"""ClassQueues: caps, service order (class, aging, policy), cancellation, expiry."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.classes import QueueClass
from scheduler.queues import (
    ACCEPTED,
    ClassQueues,
    FifoRequestQueue,
    PendingRequest,
    PriorityRequestQueue,
    QueueConfig,
    create_request_queue,
)

F, N, S = QueueClass.FAST, QueueClass.NORMAL, QueueClass.SLOW


def req(rid, cls=F, t=0.0, tokens=10, priority=0, deadline=None):
    return PendingRequest(rid, tokens, 8, t, cls, priority=priority, deadline=deadline)


def ids(reqs):
    return [r.request_id for r in reqs]


def check_integrity(q: ClassQueues) -> None:
    """Counters agree with the contents; ids are unique."""
    queued = list(q)
    assert len(queued) == len(q) == q.size
    assert len({r.request_id for r in queued}) == len(queued)
    for cls in QueueClass:
        mine = [r for r in queued if r.queue_class == cls]
        assert q.depth(cls) == len(mine)
        assert q.num_prompt_tokens(cls) == sum(r.num_prompt_tokens for r in mine)


# -- config ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    {"class_bounds": (8, 8)}, {"class_bounds": (-1, 8)}, {"max_wait_s": (0.1, 0.2)},
    {"max_wait_s": (0.1, -1.0, 1.0)}, {"max_wait_s": (0.1, float("inf"), 1.0)},
    {"max_requests": (0, 1, 1)}, {"max_prompt_tokens": (1, 1, 0)}, {"policy": "lifo"},
])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        QueueConfig(**kwargs)


def test_config_classify_and_factory():
    cfg = QueueConfig(class_bounds=(4, 16))
    assert [cfg.classify(n) for n in (4, 5, 16, 17)] == [F, N, N, S]
    assert isinstance(create_request_queue("fifo"), FifoRequestQueue)
    assert isinstance(create_request_queue("priority"), PriorityRequestQueue)
    with pytest.raises(ValueError, match="unknown queue policy"):
        create_request_queue("nope")


# -- order -------------------------------------------------------------------------------------
def test_class_order_then_fifo_within_class():
    q = ClassQueues()
    for rid, cls in [("s1", S), ("n1", N), ("f1", F), ("s2", S), ("f2", F), ("n2", N)]:
        assert q.push(req(rid, cls), 0.0) is ACCEPTED
    check_integrity(q)
    assert ids(q.take(4, 0.0)) == ["f1", "f2", "n1", "n2"]
    assert q.pop(0.0).request_id == "s1"
    assert ids(q.take(10, 0.0)) == ["s2"]
    assert q.pop(0.0) is None and len(q) == 0


def test_aging_promotes_past_higher_classes():
    cfg = QueueConfig(max_wait_s=(0.05, 0.2, 1.0))
    q = ClassQueues(cfg)
    q.push(req("slow-old", S, t=0.0), 0.0)
    q.push(req("normal", N, t=0.9), 0.9)
    q.push(req("fast", F, t=1.0), 1.0)
    # at t=1.0 the slow head has waited exactly 1.0 s: not *longer* than its bound
    assert ids(q.take(3, 1.0)) == ["fast", "normal", "slow-old"]
    q.push(req("slow-old", S, t=0.0), 1.0)
    q.push(req("fast", F, t=1.0), 1.0)
    assert ids(q.take(2, 1.001)) == ["slow-old", "fast"]


def test_aged_heads_tie_break_by_arrival_then_class():
    q = ClassQueues(QueueConfig(max_wait_s=(0.1, 0.1, 0.1)))
    q.push(req("s", S, t=0.0), 0.0)
    q.push(req("n", N, t=0.0), 0.0)
    q.push(req("f-young", F, t=5.0), 5.0)
    q.push(req("n-older", N, t=-1.0), 5.0)  # pushed after "n" although it arrived earlier
    # aged heads S@0 and N@0 ("n" heads its FIFO): equal arrival -> lower class first; then N's
    # head is "n-older", aged and oldest; "f-young" has waited 0.05 s and is not aged
    assert ids(q.take(4, 5.05)) == ["n", "n-older", "s", "f-young"]


def test_aged_fast_and_aged_slow_interleave_by_arrival():
    q = ClassQueues(QueueConfig(max_wait_s=(0.0, 0.0, 0.0)))
    for i, (rid, cls) in enumerate([("f0", F), ("s1", S), ("f2", F), ("s3", S)]):
        q.push(req(rid, cls, t=float(i)), float(i))
    assert ids(q.take(4, 10.0)) == ["f0", "s1", "f2", "s3"]


def test_priority_policy_lower_value_first_ties_fifo():
    q = ClassQueues(QueueConfig(policy="priority"))
    q.push(req("a", N, priority=5), 0.0)
    q.push(req("b", N, priority=-1), 0.0)
    q.push(req("c", N, priority=5), 0.0)
    q.push(req("d", N, priority=0), 0.0)
    q.push(req("f", F, priority=9), 0.0)
    assert ids(q.take(5, 0.0)) == ["f", "b", "d", "a", "c"]


def test_fifo_policy_ignores_priority():
    q = ClassQueues()
    q.push(req("a", N, priority=5), 0.0)
    q.push(req("b", N, priority=-1), 0.0)
    assert ids(q.take(2, 0.0)) == ["a", "b"]


def test_priority_policy_remove_and_repush_same_object():
    q = ClassQueues(QueueConfig(policy="priority"))
    rs = [req(f"r{i}", N, priority=i % 3) for i in range(100)]
    for r in rs:
        q.push(r, 0.0)
    for r in rs[:90]:  # enough removals to trigger the heap rebuild
        assert q.remove(r.request_id) is r
    q.push(rs[0], 0.0)  # re-push: its stale heap entries must not resurrect or duplicate it
    check_integrity(q)
    out = q.take(100, 0.0)
    assert sorted(ids(out)) == sorted(["r0"] + [f"r{i}" for i in range(90, 100)])
    assert [r.priority for r in out] == sorted(r.priority for r in out)


# -- caps --------------------------------------------------------------------------------------
def test_queue_full_and_prompt_token_caps_per_class():
    q = ClassQueues(QueueConfig(max_requests=(2, 8, 8), max_prompt_tokens=(100, 50, 100)))
    assert q.push(req("f1", F), 0.0).accepted
    assert q.push(req("f2", F), 0.0).accepted
    assert q.push(req("f3", F), 0.0) == (False, "queue_full", F)
    assert q.push(req("n1", N, tokens=40), 0.0).accepted
    assert q.push(req("n2", N, tokens=11), 0.0) == (False, "too_many_prompt_tokens", N)
    assert q.push(req("n3", N, tokens=10), 0.0).accepted  # exactly at the cap
    assert q.push(req("s1", S), 0.0).accepted  # other classes unaffected
    q.remove("f1")
    assert q.push(req("f3", F), 0.0).accepted  # room again
    check_integrity(q)


def test_full_queue_of_expired_requests_does_not_refuse():
    q = ClassQueues(QueueConfig(max_requests=(1, 1, 1)))
    q.push(req("old", F, deadline=1.0), 0.0)
    assert q.push(req("new", F), 2.0).accepted
    assert ids(q.take_expired(2.0)) == ["old"]
    assert ids(q.take(5, 2.0)) == ["new"]


def test_duplicate_id_raises():
    q = ClassQueues()
    q.push(req("x", F), 0.0)
    with pytest.raises(ValueError, match="already queued"):
        q.push(req("x", S), 0.0)


# -- cancellation and expiry -------------------------------------------------------------------
def test_remove_by_id_from_the_middle():
    q = ClassQueues()
    for i in range(5):
        q.push(req(f"r{i}", N, tokens=i + 1), 0.0)
    r2 = q.remove("r2")
    assert r2.request_id == "r2" and q.remove("r2") is None and q.remove("ghost") is None
    assert q.depth(N) == 4 and q.num_prompt_tokens(N) == 1 + 2 + 4 + 5
    q.push(r2, 0.0)  # the same object again goes to the back
    assert ids(q.take(10, 0.0)) == ["r0", "r1", "r3", "r4", "r2"]


def test_expired_requests_are_never_handed_out():
    q = ClassQueues()
    q.push(req("a", F, deadline=1.0), 0.0)
    q.push(req("b", F, deadline=3.0), 0.0)
    q.push(req("c", S), 0.0)
    assert q.next_expiry() == 1.0
    assert ids(q.take(10, 1.0)) == ["b", "c"]  # deadline <= now: expired
    assert ids(q.take_expired(1.0)) == ["a"]
    assert q.take_expired(5.0) == []  # b was served: its heap entry is stale
    check_integrity(q)


def test_take_expired_in_deadline_order_and_counters():
    q = ClassQueues()
    q.push(req("late", N, deadline=2.0, tokens=7), 0.0)
    q.push(req("early", S, deadline=1.0, tokens=5), 0.0)
    q.push(req("keep", N, tokens=3), 0.0)
    assert ids(q.take_expired(2.5)) == ["early", "late"]
    assert q.num_prompt_tokens(N) == 3 and q.depth(S) == 0
    check_integrity(q)


def test_expiry_heap_stays_bounded_when_requests_are_served():
    q = ClassQueues()
    q.push(req("keeper", S, deadline=5.0), 0.0)  # the queue never empties: compaction, not clear()
    for i in range(5000):
        q.push(req(f"r{i}", F, deadline=1e9), 0.0)
        assert q.take(1, 0.0)[0].request_id == f"r{i}"
        assert len(q.expiry_heap) <= 2 * (q.size + 1) + 1025  # checked on push, before the take
    assert ids(q.take_expired(5.0)) == ["keeper"]
    q.push(req("x", F, deadline=1e9), 0.0)
    q.take(1, 0.0)
    assert q.expiry_heap == []  # nothing queued: all entries were stale


def test_inspection():
    q = ClassQueues()
    assert q.oldest_arrival() is None and q.oldest_arrival(F) is None
    q.push(req("n", N, t=2.0), 2.0)
    q.push(req("s", S, t=1.0), 2.0)
    q.push(req("n2", N, t=3.0), 3.0)
    assert q.oldest_arrival() == 1.0 and q.oldest_arrival(N) == 2.0
    assert q.depth(N) == 2 and len(q) == 3 and q.get("s").request_id == "s"


# -- model-based property test -----------------------------------------------------------------
def reference_pop(model, now, max_wait):
    """Brute-force service order: aged heads by (arrival, class, seq), else class order, FIFO."""
    heads = {}
    for r in model:  # model is in push order
        heads.setdefault(r.queue_class, r)
    aged = [r for c, r in heads.items() if now - r.arrival_time > max_wait[c]]
    if aged:
        return min(aged, key=lambda r: (r.arrival_time, r.queue_class, r.seq))
    return heads[min(heads)]


op = st.one_of(
    st.tuples(st.just("push"), st.sampled_from(list(QueueClass)), st.integers(1, 50),
              st.one_of(st.none(), st.floats(0.0, 2.0))),
    st.tuples(st.just("take"), st.integers(1, 6)),
    st.tuples(st.just("remove"), st.integers(0, 40)),
    st.tuples(st.just("expire"),),
    st.tuples(st.just("tick"), st.floats(0.0, 0.3)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=80))
def test_matches_reference_model(ops):
    cfg = QueueConfig(max_wait_s=(0.05, 0.2, 0.4), max_requests=(6, 6, 6), max_prompt_tokens=(120, 120, 120))
    q = ClassQueues(cfg)
    model: list[PendingRequest] = []
    now, n = 0.0, 0
    for o in ops:
        if o[0] == "push":
            cls, tokens = o[1], o[2]
            r = req(f"r{n}", cls, t=now, tokens=tokens, deadline=None if o[3] is None else now + o[3])
            n += 1
            res = q.push(r, now)

            def over(reqs, cls=cls, tokens=tokens):
                mine = [m for m in reqs if m.queue_class == cls]
                if len(mine) >= 6:
                    return "queue_full"
                if sum(m.num_prompt_tokens for m in mine) + tokens > 120:
                    return "too_many_prompt_tokens"
                return None

            if over(model):  # the slow path purges expired requests (all classes) first
                model = [m for m in model if m.deadline is None or m.deadline > now]
            reason = over(model)
            if reason:
                assert res == (False, reason, cls)
            else:
                assert res.accepted
                model.append(r)
        elif o[0] == "take":
            got = q.take(o[1], now)
            model = [m for m in model if m.deadline is None or m.deadline > now]
            want = []
            while model and len(want) < o[1]:
                nxt = reference_pop(model, now, cfg.max_wait_s)
                model.remove(nxt)
                want.append(nxt)
            assert ids(got) == ids(want)
        elif o[0] == "remove":
            rid = f"r{o[1]}"
            expected = next((m for m in model if m.request_id == rid), None)
            assert q.remove(rid) is expected
            if expected is not None:
                model.remove(expected)
        elif o[0] == "expire":
            got = q.take_expired(now)
            assert all(g.deadline <= now for g in got)
            want = sorted((m for m in model if m.deadline is not None and m.deadline <= now),
                          key=lambda m: (m.deadline, m.seq))
            model = [m for m in model if m.deadline is None or m.deadline > now]
            # earlier purges (on a refused push) may have expired some already; those come first
            assert set(ids(want)) <= set(ids(got))
        else:
            now += o[1]
        check_integrity(q)
        assert sorted(ids(q)) == sorted(ids(model))
