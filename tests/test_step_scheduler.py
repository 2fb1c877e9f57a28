"""StepScheduler driven with fake step results; check_integrity after every step."""
from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scheduler.step_scheduler import SchedulerConfig, StepPlan, StepResult, StepScheduler


def make(num_blocks=64, block_size=4, max_model_len=256, **kw) -> StepScheduler:
    return StepScheduler(SchedulerConfig(num_blocks=num_blocks, block_size=block_size,
                                         max_model_len=max_model_len, **kw))


def fake_token(rid: str, seq_len: int) -> int:
    return 1000 + seq_len  # deterministic: depends only on the position


def step(s: StepScheduler, stopped=(), token=None):
    plan = s.schedule()
    s.block_manager.check_integrity()  # the scheduler's own checks hold between steps only
    sampled = {}
    for c in plan.chunks:
        if c.sample:
            sampled[c.request_id] = token if token is not None else fake_token(
                c.request_id, c.start_pos + len(c.token_ids))
    finished = s.update(plan, StepResult(sampled, set(stopped) & set(sampled)))
    s.check_integrity()
    return plan, finished


def run_to_end(s: StepScheduler, max_steps=10_000):
    done = {}
    for _ in range(max_steps):
        if not s.has_unfinished():
            return done
        _, fin = step(s)
        done.update({f.request_id: f for f in fin})
    raise AssertionError("did not finish")


# ---- named invariant helpers ----------------------------------------------------------------
def assert_plan_well_formed(s: StepScheduler, plan: StepPlan) -> None:
    cfg = s.config
    kinds = [c.is_prefill for c in plan.chunks]
    assert kinds == sorted(kinds), "a decode after a prefill"
    assert plan.num_batched_tokens == sum(len(c.token_ids) for c in plan.chunks)
    assert plan.num_batched_tokens <= cfg.max_num_batched_tokens
    assert len(plan.chunks) <= cfg.max_num_seqs
    ids = [c.request_id for c in plan.chunks]
    assert len(ids) == len(set(ids)), "a sequence twice in one step"
    assert not set(ids) & set(plan.preempted)
    for c in plan.chunks:
        assert len(c.block_table) * cfg.block_size >= c.start_pos + len(c.token_ids)
        assert c.is_prefill or (len(c.token_ids) == 1 and c.sample)


def assert_all_blocks_returned(s: StepScheduler) -> None:
    bm = s.block_manager
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == bm.num_blocks


# ---- unit cases ---------------------------------------------------------------------------------
def test_config_validation():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_model_len=8, num_blocks=4, max_num_seqs=8, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="class_bounds"):
        SchedulerConfig(max_model_len=8, num_blocks=4, class_bounds=(9, 8))
    with pytest.raises(ValueError, match="disagree"):
        from scheduler.block_manager import BlockManager
        StepScheduler(SchedulerConfig(max_model_len=8, num_blocks=4), BlockManager(5))


def test_rejection_at_admission():
    s = make(num_blocks=4, block_size=4, max_model_len=20)
    assert s.add_request("e", [], 4, 0.0).reason == "empty prompt"
    assert "max_model_len" in s.add_request("long", [1] * 15, 6, 0.0).reason
    assert "max_tokens" in s.add_request("zero", [1], 0, 0.0).reason
    # 17 tokens need 5 blocks; the pool has 4 (the last sampled token needs no slot)
    assert "pool has 4" in s.add_request("big", [1] * 12, 6, 0.0).reason
    assert s.add_request("fits", [1] * 12, 5, 0.0) is None
    assert "duplicate" in s.add_request("fits", [1], 1, 0.0).reason
    assert s.num_waiting == 1 and s.num_running == 0
    assert run_to_end(s)["fits"].finish_reason == "length"


def test_prefill_then_decode_then_length_finish():
    s = make()
    s.add_request("a", [5, 6, 7], max_tokens=3, arrival_time=0.0)
    plan, _ = step(s)
    (c,) = plan.chunks
    assert (c.token_ids, c.start_pos, c.is_prefill, c.sample) == ([5, 6, 7], 0, True, True)
    plan, _ = step(s)
    (c,) = plan.chunks
    assert (c.token_ids, c.start_pos, c.is_prefill) == ([1003], 3, False)
    _, fin = step(s)
    assert [f.request_id for f in fin] == ["a"]
    assert fin[0].output_token_ids == [1003, 1004, 1005] and fin[0].num_prompt_tokens == 3
    assert_all_blocks_returned(s)


def test_decodes_first_in_class_order_then_prefills():
    s = make(num_blocks=128)
    s.add_request("slow", [1] * 5, 100, 0.0)
    s.add_request("normal", [2] * 5, 30, 1.0)
    s.add_request("fast", [3] * 5, 6, 2.0)
    s.add_request("fast2", [4] * 5, 7, 3.0)
    step(s)
    s.add_request("new", [9] * 5, 10, 4.0)
    plan, _ = step(s)
    assert_plan_well_formed(s, plan)
    assert [(c.request_id, c.is_prefill) for c in plan.chunks] == [
        ("fast", False), ("fast2", False), ("normal", False), ("slow", False), ("new", True)]


def test_class_changes_as_tokens_are_generated():
    s = make(num_blocks=128, class_bounds=(2, 4))
    s.add_request("a", [1] * 3, 4, 0.0)  # remaining 4: Normal
    s.add_request("b", [2] * 3, 10, 1.0)  # Slow
    s.add_request("c", [3] * 3, 3, 2.0)  # remaining 3 -> Normal
    step(s)  # prefill: a, b, c have 1 token each -> remaining a=3, b=9, c=2 (Fast)
    plan, _ = step(s)
    assert [c.request_id for c in plan.chunks] == ["c", "a", "b"]


def test_chunked_prefill_respects_budget():
    s = make(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=8)
    s.add_request("d", [1, 2], 50, 0.0)
    step(s)  # d decoding from now on
    s.add_request("p", list(range(20)), 2, 1.0)
    chunks = []
    while True:
        plan, _ = step(s)
        assert_plan_well_formed(s, plan)
        assert "d" in {c.request_id for c in plan.chunks if not c.is_prefill}
        pre = [c for c in plan.chunks if c.is_prefill]
        if not pre:
            break
        chunks.append((pre[0].start_pos, len(pre[0].token_ids), pre[0].sample))
    assert chunks == [(0, 7, False), (7, 7, False), (14, 6, True)]


def test_max_num_seqs():
    s = make(num_blocks=64, max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(3):
        s.add_request(f"r{i}", [i] * 4, 5, float(i))
    plan, _ = step(s)
    assert [c.request_id for c in plan.chunks] == ["r0", "r1"] and s.num_waiting == 1


def test_preempt_lowest_class_latest_arrival_and_recompute_keeps_tokens():
    # 6 blocks of 2 tokens; three requests of 3-token prompts take 2 blocks each
    s = make(num_blocks=6, block_size=2, max_model_len=64, enable_prefix_caching=False,
             class_bounds=(2, 5))
    for rid, prompt, max_tokens, arrival in (("slow_old", [1, 1, 1], 9, 0.0),
                                             ("slow_new", [2, 2, 2], 9, 1.0),
                                             ("fast", [3, 3, 3], 3, 2.0)):
        assert s.add_request(rid, prompt, max_tokens, arrival) is None
    step(s)
    plan, _ = step(s)  # position 3 fits in the second block: no shortage
    assert plan.preempted == []
    plan, _ = step(s)  # position 4 needs a third block each: pool empty
    assert plan.preempted == ["slow_new"]
    assert [c.request_id for c in plan.chunks] == ["fast", "slow_old"]
    assert s.num_preemptions == 1 and s.stats().num_preemptions == 1
    generated = s.requests["slow_new"].output_token_ids
    assert len(generated) == 2
    while "slow_new" not in {c.request_id for c in plan.chunks}:
        plan, _ = step(s)
    (c,) = [c for c in plan.chunks if c.request_id == "slow_new"]
    assert c.is_prefill and c.start_pos == 0 and c.token_ids == [2, 2, 2] + generated
    done = run_to_end(s)
    out = done["slow_new"].output_token_ids
    assert out[:2] == generated and len(out) == 9
    assert out == [fake_token("", 3 + i) for i in range(9)]  # same as an unpreempted run
    assert_all_blocks_returned(s)


def test_preempting_itself_when_it_is_the_lowest():
    s = make(num_blocks=3, block_size=2, max_model_len=64, enable_prefix_caching=False,
             class_bounds=(2, 3))
    assert s.add_request("a", [1, 1, 1], 3, 0.0) is None  # Fast; position 3 fits its 2 blocks
    assert s.add_request("b", [2, 2], 5, 1.0) is None  # Slow; position 2 needs a new block
    step(s)
    plan, _ = step(s)  # a is scheduled; b is the only candidate left: it preempts itself
    assert plan.preempted == ["b"] and [c.request_id for c in plan.chunks] == ["a"]
    assert run_to_end(s).keys() == {"a", "b"}


def test_stop_finishes_with_stop_reason():
    s = make()
    s.add_request("a", [1, 2], 10, 0.0)
    step(s)
    _, fin = step(s, stopped={"a"})
    assert fin[0].finish_reason == "stop" and len(fin[0].output_token_ids) == 2
    assert_all_blocks_returned(s)


@pytest.mark.parametrize("when", ["waiting", "prefilling", "decoding", "mid_step"])
def test_abort_frees_blocks_in_any_state(when):
    s = make(num_blocks=16, max_num_batched_tokens=4, max_num_seqs=4)
    s.add_request("a", list(range(10)), 5, 0.0)
    if when == "prefilling":
        step(s)
        assert s.requests["a"].is_prefilling
    elif when == "decoding":
        for _ in range(3):
            step(s)
        assert not s.requests["a"].is_prefilling
    plan = s.schedule() if when == "mid_step" else None
    fin = s.abort("a")
    assert fin.finish_reason == "abort" and s.abort("a") is None
    if plan is not None:
        assert s.update(plan, StepResult({})) == []
    s.check_integrity()
    assert_all_blocks_returned(s)
    assert not s.has_unfinished()


def test_prefix_cache_hit_skips_tokens():
    s = make(num_blocks=32, block_size=4)
    prompt = list(range(10))
    s.add_request("a", prompt, 5, 0.0)
    step(s)
    s.add_request("b", prompt + [77], 2, 1.0)
    plan, _ = step(s)
    (c,) = [c for c in plan.chunks if c.request_id == "b"]
    assert c.start_pos == 8 and c.token_ids == [8, 9, 77]
    assert c.block_table[:2] == s.block_manager.block_table("a")[:2]
    done = run_to_end(s)
    assert done["b"].num_cached_tokens == 8 and done["a"].num_cached_tokens == 0
    assert s.stats().num_prefix_hit_tokens == 8


def test_same_step_prompts_never_hit_uncomputed_blocks():
    s = make(num_blocks=32, block_size=4)
    s.add_request("a", list(range(10)), 2, 0.0)
    s.add_request("b", list(range(10)), 2, 0.0)
    plan, _ = step(s)
    assert [c.start_pos for c in plan.chunks] == [0, 0]


def test_update_rejects_stale_plan_and_missing_token():
    s = make()
    s.add_request("a", [1, 2], 5, 0.0)
    plan = s.schedule()
    with pytest.raises(ValueError, match="no sampled token"):
        s.update(plan, StepResult({}))
    s = make()
    s.add_request("a", [1, 2], 5, 0.0)
    plan = s.schedule()
    s.update(plan, StepResult({"a": 3}))
    with pytest.raises(ValueError, match="stale plan"):
        s.update(plan, StepResult({"a": 3}))


# ---- property: random workloads -------------------------------------------------------------------
REQ = st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=10), st.integers(1, 10))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(REQ, min_size=1, max_size=10), num_blocks=st.integers(4, 12),
       block_size=st.integers(2, 4), budget=st.integers(8, 24), caching=st.booleans(),
       arrival_p=st.floats(0.2, 1.0), seed=st.randoms(use_true_random=False))
def test_random_workloads_finish_and_return_every_block(reqs, num_blocks, block_size, budget,
                                                        caching, arrival_p, seed):
    s = make(num_blocks=num_blocks, block_size=block_size, max_model_len=64, max_num_seqs=8,
             max_num_batched_tokens=budget, enable_prefix_caching=caching)
    pending = list(enumerate(reqs))
    accepted: dict[str, tuple] = {}
    done = {}
    for t in range(5000):
        while pending and seed.random() < arrival_p:
            i, (prompt, max_tokens) = pending.pop(0)
            if s.add_request(f"r{i}", prompt, max_tokens, float(t)) is None:
                accepted[f"r{i}"] = (prompt, max_tokens)
        if seed.random() < 0.02 and s.requests:
            rid = seed.choice(sorted(s.requests))
            done[rid] = s.abort(rid)
        plan, fin = step(s, stopped={r for r in s.requests if seed.random() < 0.03})
        assert_plan_well_formed(s, plan)
        done.update({f.request_id: f for f in fin})
        if not pending and not s.has_unfinished():
            break
    assert not s.has_unfinished()
    event(f"accepted {min(len(accepted), 5)}+, preemptions: {s.num_preemptions > 0}")
    assert done.keys() == accepted.keys()
    for rid, (prompt, max_tokens) in accepted.items():
        f = done[rid]
        n = len(f.output_token_ids)
        assert n == max_tokens if f.finish_reason == "length" else n <= max_tokens
        if f.finish_reason != "abort":  # tokens at the right positions despite preemption
            assert f.output_token_ids == [fake_token(rid, len(prompt) + j) for j in range(n)]
    assert_all_blocks_returned(s)


# ---- multi-step advance equals k single steps ---------------------------------------------------
def snapshot(s: StepScheduler) -> dict:
    bm = s.block_manager
    return {
        "seqs": {rid: (q.status, list(q.token_ids), q.num_computed_tokens, q.num_prefill_tokens,
                       list(bm.block_table(rid)) if rid in bm else None)
                 for rid, q in s.requests.items()},
        "running": [q.request_id for q in s.running],
        "waiting": [q.request_id for q in s.waiting],
        "free": bm.free_list(), "cached": bm.cached_prefixes(),
        "refs": [bm.ref_count(b) for b in range(bm.num_blocks)],
        "hashes": {k: list(bm.block_hashes(k)) for k in bm.seq_ids()},
        "counters": (s.num_steps, s.num_preemptions, bm.num_evictions, bm.num_query_tokens,
                     bm.num_hit_tokens),
        "stats": s.stats(),
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(st.tuples(st.lists(st.integers(0, 1), min_size=1, max_size=20),
                               st.integers(1, 40)), min_size=1, max_size=10),
       num_blocks=st.integers(4, 40), block_size=st.integers(1, 4), caching=st.booleans(),
       max_num_seqs=st.integers(1, 6), seed=st.randoms(use_true_random=False), past=st.booleans())
def test_advance_equals_single_steps(reqs, num_blocks, block_size, caching, max_num_seqs, seed, past):
    s = make(num_blocks=num_blocks, block_size=block_size, max_model_len=64,
             max_num_seqs=max_num_seqs, max_num_batched_tokens=16, enable_prefix_caching=caching,
             class_bounds=(3, 9))
    pending = list(enumerate(reqs))
    for _ in range(400):
        while pending and seed.random() < 0.4:
            i, (prompt, max_tokens) = pending.pop(0)
            s.add_request(f"r{i}", prompt, max_tokens, float(seed.randint(0, 3)), seed.randint(0, 1))
        if not pending and not s.has_unfinished():
            break
        k = s.max_pure_decode_steps(past_finishes=past)
        if k == 0 or seed.random() < 0.3:
            step(s, token=0)
            continue
        j = max(1, round(k * seed.random()))
        reason = "finish" if any(q.max_tokens - q.num_output_tokens == k for q in s.running) else (
            "head" if s.waiting else "blocks")
        event(f"k bound by {reason}; j == k: {j == k}")
        single, multi = s, copy.deepcopy(s)
        running = sorted(q.request_id for q in single.running)
        fin_single = []
        for _ in range(j):
            assert past or not fin_single, "finished before the last step"
            plan, fin = step(single, token=0)
            assert sorted(c.request_id for c in plan.chunks) == running
            assert not plan.preempted
            assert all(not c.is_prefill for c in plan.chunks)
            fin_single += fin
            running = sorted(set(running) - {f.request_id for f in fin})
            if past and fin and not s.waiting:
                event("stretch passed a finish")
        # half the time with the bound the caller already has (nothing changed since k)
        fin_multi = multi.advance_decode_steps(j, token_id=0, past_finishes=past,
                                               allowed=k if j % 2 else None)
        multi.check_integrity()
        assert fin_multi == fin_single
        assert snapshot(multi) == snapshot(single)
        if j == k and reason == "blocks" and not past:  # tight: one more step would preempt
            assert step(copy.deepcopy(s), token=0)[0].preempted
    assert not s.has_unfinished()


def test_max_pure_decode_steps_cases():
    s = make(num_blocks=8, block_size=4, max_model_len=64)
    assert s.max_pure_decode_steps() == 0  # nothing running
    assert s.add_request("a", [1] * 4, 29, 0.0) is None  # 32 slots at most: the whole pool
    assert s.max_pure_decode_steps() == 0  # waiting and admissible
    step(s)  # a: 4 computed, 1 block, 28 tokens to go
    assert s.max_pure_decode_steps() == 28
    s.block_manager.allocate("hog", [0] * 5)  # take 2 blocks: 5 left = 20 more slots
    assert s.max_pure_decode_steps() == 20
    s2 = make(num_blocks=64, block_size=4, max_model_len=64)
    s2.add_request("a", [1] * 4, 10, 0.0)
    step(s2)
    assert s2.max_pure_decode_steps() == 9  # finishes on the 9th step
    assert len(copy.deepcopy(s2).advance_decode_steps(9)) == 1
    assert len(copy.deepcopy(s2).advance_decode_steps(9, allowed=9)) == 1
    with pytest.raises(ValueError, match="at most 9"):
        s2.advance_decode_steps(10)
    with pytest.raises(ValueError, match="at most 9"):  # the caller's bound is still enforced
        s2.advance_decode_steps(10, allowed=9)
    s2.add_request("b", [2] * 5, 5, 1.0)
    assert s2.max_pure_decode_steps() == 0  # b can be admitted
    step(s2)
    assert s2.max_pure_decode_steps() == 0 or not s2.requests["b"].is_prefilling


def test_stretch_past_finishes_only_when_nothing_waits():
    s = make(num_blocks=64, block_size=4, max_model_len=64)
    s.add_request("a", [1] * 4, 10, 0.0)
    s.add_request("b", [2] * 4, 20, 0.0)
    step(s)
    assert s.max_pure_decode_steps() == 9  # a finishes on the 9th step
    assert s.max_pure_decode_steps(past_finishes=True) == 19  # b, the last, on the 19th
    assert s.max_pure_decode_steps(past_finishes=True, max_steps=12) == 12
    single, multi = copy.deepcopy(s), copy.deepcopy(s)
    fins = [f for _ in range(19) for f in step(single, token=0)[1]]
    assert multi.advance_decode_steps(19, past_finishes=True) == fins
    assert [f.request_id for f in fins] == ["a", "b"] and not multi.requests
    with pytest.raises(ValueError, match="at most 9"):
        copy.deepcopy(s).advance_decode_steps(12)
    s.add_request("c", [3] * 44, 1, 1.0)  # waits (blocked): a's finish would free its blocks
    s.block_manager.allocate("hog", [0] * 4 * 52)
    assert s.max_pure_decode_steps(past_finishes=True) == 9


def test_blocked_head_allows_stretch():
    s = make(num_blocks=4, block_size=4, max_model_len=64, enable_prefix_caching=False)
    s.add_request("a", [1] * 8, 8, 0.0)  # 2 blocks now, up to 4 later
    step(s)
    s.add_request("b", [2] * 9, 3, 1.0)  # needs 3 blocks, 2 free: blocked
    assert s.max_pure_decode_steps() == 7  # a finishes on step 7


# ---- unlisted decodes (the simulator's schedule(list_decodes=False)) equal listed ones ----------
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(st.tuples(st.lists(st.integers(0, 1), min_size=1, max_size=20),
                               st.integers(1, 40)), min_size=1, max_size=10),
       num_blocks=st.integers(4, 40), block_size=st.integers(1, 4), caching=st.booleans(),
       max_num_seqs=st.integers(1, 6), seed=st.randoms(use_true_random=False))
def test_unlisted_decodes_equal_listed(reqs, num_blocks, block_size, caching, max_num_seqs, seed):
    """Same workload, one scheduler listing its decodes, one not (token 0 everywhere): identical
    plans (less the decode chunks), finishes, preemptions and state after every step."""
    kw = {"num_blocks": num_blocks, "block_size": block_size, "max_model_len": 64,
          "max_num_seqs": max_num_seqs, "max_num_batched_tokens": 16,
          "enable_prefix_caching": caching, "class_bounds": (3, 9)}
    listed, unlisted = make(**kw), make(**kw)
    pending = list(enumerate(reqs))
    for _ in range(400):
        while pending and seed.random() < 0.4:
            i, (prompt, max_tokens) = pending.pop(0)
            for s in (listed, unlisted):
                s.add_request(f"r{i}", prompt, max_tokens, float(i % 3), i % 2)
        if not pending and not listed.has_unfinished():
            break
        plan_a, fin_a = step(listed, token=0)
        plan_b = unlisted.schedule(list_decodes=False)
        fin_b = unlisted.update(plan_b, StepResult({c.request_id: 0 for c in plan_b.chunks if c.sample}))
        unlisted.check_integrity()
        assert plan_b.num_decodes == plan_a.num_decodes
        assert [c for c in plan_a.chunks if c.is_prefill] == plan_b.chunks
        assert (plan_a.preempted, plan_a.num_batched_tokens) == (plan_b.preempted,
                                                                 plan_b.num_batched_tokens)
        assert fin_a == fin_b
        assert snapshot(unlisted) == snapshot(listed)
    assert not listed.has_unfinished() and not unlisted.has_unfinished()
