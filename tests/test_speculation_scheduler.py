"""Speculative decoding in the step scheduler: verify chunks, rollback of rejected drafts'
slots, and the lazy decode bookkeeping around them. A fake "model" (the next token is a pure
function of the sequence so far) makes the output of every run predictable: drafts, whatever
they are, must leave the output and the block accounting exactly as plain decoding does."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.step_scheduler import SchedulerConfig, StepResult, StepScheduler

VOCAB = 50
EOS = 7


def model_next(tokens: list[int]) -> int:
    """The fake model's greedy token after `tokens` (depends on the last two tokens)."""
    a = tokens[-1]
    b = tokens[-2] if len(tokens) > 1 else 0
    return (a * 31 + b * 17 + 5) % VOCAB


def make(**kw) -> StepScheduler:
    cfg = {"num_blocks": 64, "block_size": 4, "max_model_len": 200}
    cfg.update(kw)
    return StepScheduler(SchedulerConfig(**cfg))


def run(s: StepScheduler, requests, draft_fn=None, stop_on_eos=False, max_steps=5000):
    """Drive `s` to the end; `draft_fn(tokens) -> drafts` proposes per decoding sequence.
    Returns {request id: (output tokens, finish reason)} and the number of draft tokens fed."""
    for rid, prompt, max_tokens in requests:
        assert s.add_request(rid, prompt, max_tokens, 0.0) is None
    done, fed = {}, 0
    for _ in range(max_steps):
        if not s.has_unfinished():
            break
        drafts = None
        if draft_fn is not None:
            drafts = {q.request_id: draft_fn(q.token_ids) for q in s.decoding_sequences()}
        plan = s.schedule(drafts=drafts)
        s.block_manager.check_integrity()
        sampled, accepted, stopped = {}, {}, set()
        for c in plan.chunks:
            if not c.sample:
                continue
            seq = s.requests[c.request_id]
            history = list(seq.token_ids[:c.start_pos + len(c.token_ids) - c.num_draft])
            if c.num_draft:
                fed += c.num_draft
                drafts_c = c.token_ids[len(c.token_ids) - c.num_draft:]
                acc = []
                for d in drafts_c:
                    t = model_next(history)
                    if t != d or (stop_on_eos and t == EOS):
                        break
                    acc.append(d)
                    history.append(d)
                accepted[c.request_id] = acc
            tok = model_next(history)
            sampled[c.request_id] = tok
            if stop_on_eos and tok == EOS:
                stopped.add(c.request_id)
        for f in s.update(plan, StepResult(sampled, stopped, accepted=accepted)):
            done[f.request_id] = (f.output_token_ids, f.finish_reason)
        s.check_integrity()
    assert not s.has_unfinished()
    bm = s.block_manager
    assert bm.num_used_blocks == 0, "blocks leaked"
    bm.check_integrity()
    return done, fed


def oracle_drafts(k, wrong_every=0, rng=None):
    """Drafts that follow the fake model for k tokens (a wrong one at random when asked)."""
    def fn(tokens):
        out, hist = [], list(tokens)
        for i in range(k):
            t = model_next(hist)
            if wrong_every and rng.random() < 1.0 / wrong_every:
                t = (t + 1) % VOCAB
            out.append(t)
            hist.append(t)
        return out
    return fn


REQS = [("a", [1, 2, 3], 30), ("b", [4, 5, 6, 7, 8, 9, 10], 17), ("c", [11] * 9, 40)]


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_output_equals_plain_decoding_with_perfect_and_wrong_drafts(caching, k):
    base, _ = run(make(enable_prefix_caching=caching), REQS)
    perfect, fed = run(make(enable_prefix_caching=caching), REQS, oracle_drafts(k))
    assert perfect == base and fed > 0
    noisy, _ = run(make(enable_prefix_caching=caching), REQS,
                   oracle_drafts(k, wrong_every=3, rng=random.Random(k)))
    assert noisy == base
    garbage, _ = run(make(enable_prefix_caching=caching), REQS, lambda toks: [0] * k)
    assert garbage == base


def test_perfect_drafts_take_fewer_steps():
    s0 = make()
    run(s0, REQS)
    s1 = make()
    run(s1, REQS, oracle_drafts(4))
    assert s1.num_steps < s0.num_steps * 0.5


def test_stop_token_inside_accepted_drafts_finishes_there():
    base, _ = run(make(), REQS, stop_on_eos=True)
    spec, _ = run(make(), REQS, oracle_drafts(5), stop_on_eos=True)
    assert spec == base


def test_drafts_respect_max_tokens_and_max_model_len():
    reqs = [("x", [1, 2], 5), ("y", [3] * 10, 10)]
    s = make(max_model_len=20)
    base, _ = run(make(max_model_len=20), reqs)
    spec, _ = run(s, reqs, oracle_drafts(8))
    assert spec == base
    assert len(spec["x"][0]) == 5 and spec["x"][1] == "length"
    assert len(spec["y"][0]) == 10  # 10 prompt + 10 = max_model_len


def test_draft_within_block_keeps_a_verify_in_one_block():
    s = make(draft_within_block=True)
    assert s.add_request("a", [1, 2, 3], 30, 0.0) is None
    for _ in range(3):  # prefill, then decodes
        plan = s.schedule(drafts={q.request_id: [1] * 8 for q in s.decoding_sequences()})
        for c in plan.chunks:
            if c.num_draft:
                first, last = c.start_pos // 4, (c.start_pos + c.num_draft) // 4
                assert first == last
        s.update(plan, StepResult({c.request_id: 9 for c in plan.chunks if c.sample}))
        s.check_integrity()


def test_rejected_drafts_give_their_blocks_back():
    s = make(num_blocks=16, block_size=4)
    assert s.add_request("a", [1, 2, 3, 4], 40, 0.0) is None
    plan = s.schedule()
    s.update(plan, StepResult({"a": 5}))
    used = s.block_manager.num_used_blocks
    plan = s.schedule(drafts={"a": [1] * 9})
    (c,) = plan.chunks
    assert c.num_draft == 9 and c.token_ids == [5] + [1] * 9
    assert s.block_manager.num_used_blocks == used + 3  # slots 4 .. 13: three blocks past 0
    s.update(plan, StepResult({"a": 6}, accepted={"a": []}))  # all rejected
    s.check_integrity()
    assert s.block_manager.num_used_blocks == used + 1  # slot 4 (its last token) kept
    assert s.requests["a"].num_computed_tokens == 5


def test_drafts_never_preempt_and_shrink_to_the_free_blocks():
    s = make(num_blocks=3, block_size=4, max_model_len=12)
    assert s.add_request("a", [1, 2, 3], 8, 0.0) is None
    plan = s.schedule()
    s.update(plan, StepResult({"a": 4}))
    plan = s.schedule(drafts={"a": [1] * 20})
    (c,) = plan.chunks
    # limit: 3 + 8 = 11 tokens; 4 now, the verify may add k + 1 <= 7
    assert c.num_draft == 6
    s.update(plan, StepResult({"a": 9}, accepted={"a": [1, 1]}))
    s.check_integrity()
    assert s.requests["a"].token_ids == [1, 2, 3, 4, 1, 1, 9]


def test_bad_accepted_list_is_refused():
    s = make()
    assert s.add_request("a", [1, 2, 3], 10, 0.0) is None
    plan = s.schedule()
    s.update(plan, StepResult({"a": 4}))
    plan = s.schedule(drafts={"a": [8, 9]})
    with pytest.raises(ValueError, match="not a prefix"):
        s.update(plan, StepResult({"a": 1}, accepted={"a": [9]}))


def test_abort_during_speculation_frees_everything():
    s = make()
    assert s.add_request("a", [1, 2, 3], 30, 0.0) is None
    plan = s.schedule()
    s.update(plan, StepResult({"a": 4}))
    s.schedule(drafts={"a": [1] * 7})
    s.abort("a")
    assert s.block_manager.num_used_blocks == 0
    s.block_manager.check_integrity()


def test_budget_limits_draft_tokens():
    s = make(max_num_seqs=4, max_num_batched_tokens=6)
    for r in "ab":
        assert s.add_request(r, [1, 2, 3], 30, 0.0) is None
    plan = s.schedule()
    s.update(plan, StepResult({c.request_id: 4 for c in plan.chunks if c.sample}))
    plan = s.schedule(drafts={"a": [1] * 5, "b": [2] * 5})
    assert plan.num_batched_tokens <= 6
    assert sum(len(c.token_ids) for c in plan.chunks) <= 6
    assert [c.num_draft for c in plan.chunks] == [0, 4]  # the budget left b a plain decode
    assert not plan.chunks[0].is_prefill


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 8), st.booleans(), st.integers(6, 40))
def test_random_drafts_random_pools(seed, k, caching, num_blocks):
    rng = random.Random(seed)
    reqs = [(f"r{i}", [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))],
             rng.randint(1, 25)) for i in range(rng.randint(1, 5))]
    kw = {"num_blocks": num_blocks, "enable_prefix_caching": caching, "max_model_len": 40}
    if any(-(-(len(p) + m - 1) // 4) > num_blocks for _, p, m in reqs):
        return
    base, _ = run(make(**kw), reqs, stop_on_eos=True)
    spec, _ = run(make(**kw), reqs, oracle_drafts(k, wrong_every=2, rng=rng), stop_on_eos=True)
    assert spec == base
