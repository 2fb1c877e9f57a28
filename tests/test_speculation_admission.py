"""Admission of long prompts must not stall the serving loop's drafting (issue 28): the H200's
c=32 edit run held one step's planning ~150 ms while prompt lookup indexed 12 new ~3,100-token
prompts in Python, all at their first draft. Prompt lookup now indexes at most
`lookup_index_tokens_per_step` tokens a step over all requests (the rest in the next steps),
with a bulk build per call; the indexes and the drafts are those of the one-go build."""
from __future__ import annotations

import gc
import random

import pytest

from scheduler.speculation import NgramIndex, SpeculationConfig, Speculator, _PositionsIndex


def _reference_tables(tokens, n_min, n_max):
    """The per-token build (the index's definition): each n-gram's latest continuation, by the
    n-gram's key."""
    tables = [{} for _ in range(n_max - n_min + 1)]
    for end in range(len(tokens)):
        for j, table in enumerate(tables):
            n = n_min + j
            if end >= n:
                table[NgramIndex.key(tokens[end - n:end])] = end
    return tables


@pytest.mark.parametrize("seed", range(5))
def test_bulk_extend_equals_the_per_token_build(seed):
    rng = random.Random(seed)
    toks = [rng.randrange(6) for _ in range(rng.randrange(0, 300))]  # small alphabet: repeats
    idx = NgramIndex(2, 4)
    i = 0
    while i < len(toks):  # appended in chunks of every size, 1 token included
        k = rng.choice((1, 1, 2, 3, 7, 50))
        idx.extend(toks[i:i + k])
        i += k
    assert idx.tokens == toks
    assert idx.tables == _reference_tables(toks, 2, 4)
    assert NgramIndex(2, 4, toks).tables == idx.tables
    one = NgramIndex(1, 3)
    one.extend(toks[:7])
    one.extend(toks[7:])
    assert one.tables == _reference_tables(toks, 1, 3)


def test_keys_tell_ngrams_apart_and_tables_stay_out_of_the_gc():
    big = 2**31 - 1  # the largest int32 id (keys are compared within one n: one table each)
    pairs = ([0, 1], [1, 0], [big, 0], [0, big], [1, 2], [big, big], [2, 1], [0, 0])
    assert len({NgramIndex.key(g) for g in pairs}) == len(pairs)
    quads = ([0, 0, 0, 1], [1, 0, 0, 0], [0, big, 0, big], [big, 0, big, 0], [big] * 4)
    assert len({NgramIndex.key(g) for g in quads}) == len(quads)
    idx = NgramIndex(2, 4, [5, 6, 7, 5, 6, 8] * 50)
    assert idx.lookup([5, 6]) == len(idx.tokens) - 1  # the last (5, 6) is followed by 8
    assert not any(gc.is_tracked(t) for t in idx.tables)


@pytest.mark.parametrize("seed", range(3))
def test_positions_index_lists_every_start(seed):
    rng = random.Random(seed)
    toks = [rng.randrange(4) for _ in range(200)]
    ref: dict = {}
    for s in range(len(toks) - 2):
        ref.setdefault(tuple(toks[s:s + 3]), []).append(s)
    assert _PositionsIndex(toks, 3).starts == ref
    assert _PositionsIndex(toks[:2], 3).starts == {}


def _code_prompt(rng, n):
    # code-like ids: lines drawn from a small set of lines, so n-grams repeat
    lines = [[rng.randrange(200) for _ in range(rng.randrange(4, 12))] for _ in range(40)]
    out = []
    while len(out) < n:
        out.extend(rng.choice(lines) + [10])
    return out[:n]


def _indexed(sp):
    return sum(len(st.history.tokens) for st in sp.states.values() if st.history is not None)


def test_a_batch_of_long_prompts_is_indexed_over_several_steps():
    """12 requests of 3,100 tokens start decoding in the same step (the H200 log's case): that
    step indexes at most the allowance, not 37,200 tokens (the old build indexed them all at
    the first draft, in that step); a few steps later every index has caught up and the drafts
    are those of an unlimited speculator."""
    rng = random.Random(1)
    prompts = [_code_prompt(rng, 3100) for _ in range(12)]
    budget = 4096  # the server's default
    limited = Speculator(SpeculationConfig())
    for i, p in enumerate(prompts):
        limited.add(f"r{i}", p)
        limited.append(f"r{i}", p[100:103])  # the output so far repeats the prompt
    steps = 0
    while True:
        for i in range(12):  # one step: every decoding sequence's load, then the plan
            limited.load(f"r{i}", 100)
        limited.plan([], 12, 0)
        steps += 1
        assert _indexed(limited) <= budget * steps
        if _indexed(limited) == 12 * 3103:
            break
        assert steps < 20
    assert steps == -(-12 * 3103 // budget)  # the allowance used to the full each step
    assert SpeculationConfig().lookup_index_tokens_per_step == budget
    unlimited = Speculator(SpeculationConfig(lookup_index_tokens_per_step=0))
    for i, p in enumerate(prompts):
        unlimited.add(f"r{i}", p)
        unlimited.append(f"r{i}", p[100:103])
        unlimited.load(f"r{i}", 100)
    assert _indexed(unlimited) == 12 * 3103  # no limit: all in one step
    for i in range(12):
        a, b = limited.get(f"r{i}"), unlimited.get(f"r{i}")
        assert a.history.tokens == b.history.tokens == prompts[i] + prompts[i][100:103]
        assert a.history.tables == b.history.tables
        assert a.pending_draft == b.pending_draft and a.pending_draft


def test_output_appended_while_the_index_catches_up_is_indexed_once():
    rng = random.Random(2)
    prompt = _code_prompt(rng, 500)
    sp = Speculator(SpeculationConfig(sources=("prompt",), lookup_index_tokens_per_step=120))
    sp.add("r", prompt)
    out = []
    for step in range(12):
        new = prompt[50 + 3 * step:53 + 3 * step]
        out += new
        sp.append("r", new)  # arrives between the steps' partial builds
        got = sp.propose("r", 4)
        sp.plan([], 1, 0)
        st = sp.get("r")
        assert st.history.tokens == (prompt + out)[:len(st.history.tokens)]
    assert st.history.tokens == prompt + out  # 536 tokens: caught up at the 5th step
    ref = NgramIndex(2, 4, prompt + out)
    assert st.history.tables == ref.tables
    pos = ref.lookup(ref.tokens[-4:])
    assert got == ref.tokens[pos:pos + 4]


def test_a_request_without_a_prompt_draft_yet_still_drafts_from_its_prediction():
    sp = Speculator(SpeculationConfig(lookup_index_tokens_per_step=100))
    sp.add("big", list(range(1000)) * 3)  # takes the step's whole allowance first
    sp.add("r", list(range(50)), prediction=[7, 8, 9, 10])
    assert sp.load("big", 50) is None or sp.get("big").pending_source != "prompt"
    load = sp.load("r", 50)
    assert load is not None and sp.get("r").pending_source == "prediction"


def test_the_allowance_is_validated():
    with pytest.raises(ValueError):
        SpeculationConfig(lookup_index_tokens_per_step=-1)


def test_no_draft_back_off_while_an_index_catches_up():
    """An engine that pipelines its steps backs off from asking for drafts after an ask that
    drafted nothing (DraftBackoff); an ask that came back empty because prompt lookup's index
    was still being built must not count, or the index would advance only on the asks the
    back-off leaves (1, 3, 7, 15 turns apart)."""
    rng = random.Random(3)
    sp = Speculator(SpeculationConfig(sources=("prompt",), lookup_index_tokens_per_step=4096))
    sp.add("r", _code_prompt(rng, 10000))
    sp.append("r", [999, 998])  # nothing in the prompt follows these: no draft once indexed
    asks = 0
    while len(sp.get("r").history.tokens if sp.get("r").history else ()) < 10002:
        assert not sp.backoff.skip()  # every turn asks while indexing
        load = sp.load("r", 50)
        drafts = sp.plan([load] if load else [], 1, 0)
        sp.backoff.asked(bool(drafts))
        asks += 1
    assert asks == 3  # 4096 + 4096 + 1810 tokens
    assert sp.backoff.skip()  # the last ask indexed all and found nothing: the back-off starts


def test_the_allowance_flag_round_trips():
    import argparse

    from scheduler.speculation import add_speculation_arguments, speculation_config_from_args
    p = argparse.ArgumentParser()
    add_speculation_arguments(p)
    assert speculation_config_from_args(p.parse_args([])).lookup_index_tokens_per_step == 4096
    cfg = speculation_config_from_args(p.parse_args(["--speculation-index-tokens", "0"]))
    assert cfg.lookup_index_tokens_per_step == 0
    assert Speculator(cfg).prompt.tokens_per_step is None  # 0: no limit


def test_index_ahead_catches_up_started_indexes_in_the_devices_shadow():
    """The CUDA engine indexes after each launch, while the device runs (`Speculator.
    index_ahead`): started indexes catch up at up to the allowance there too, so twelve new
    3,103-token prompts are indexed in half the steps, and the planning a drafting step waits
    for does less of it. Indexes never asked for (a request that has not drafted) stay unbuilt,
    as do those of requests with speculation off; the tables are those of the one-go build."""
    rng = random.Random(5)
    prompts = [_code_prompt(rng, 3100) for _ in range(12)]
    budget = 4096

    def speculator():
        sp = Speculator(SpeculationConfig(sources=("prompt",), lookup_index_tokens_per_step=budget))
        for i, p in enumerate(prompts):
            sp.add(f"r{i}", p)
            sp.append(f"r{i}", p[100:103])
        return sp

    def steps_to_index(shadow: bool) -> int:
        sp = speculator()
        steps = 0
        while _indexed(sp) < 12 * 3103:
            for i in range(12):
                sp.load(f"r{i}", 100)
            sp.plan([], 12, 0)
            if shadow:
                assert sp.index_ahead() <= budget
            steps += 1
            assert steps < 20
        for i in range(12):
            ref = NgramIndex(2, 4, prompts[i] + prompts[i][100:103])
            assert sp.get(f"r{i}").history.tables == ref.tables
        return steps

    assert steps_to_index(False) == -(-12 * 3103 // budget)  # 10
    assert steps_to_index(True) == -(-12 * 3103 // (2 * budget))  # 5
    sp = Speculator(SpeculationConfig(sources=("prompt",), lookup_index_tokens_per_step=1000))
    for i in range(2):
        sp.add(f"r{i}", prompts[i])
    sp.add("off", prompts[2], off=True)
    assert sp.index_ahead() == 0  # nothing was asked for yet
    assert all(st.history is None for st in sp.states.values())
    sp.load("r0", 100)  # the ask starts r0's index: 1,000 tokens in the planning
    sp.plan([], 1, 0)
    assert sp.index_ahead() == 1000  # 1,000 more in the shadow, all r0's
    assert len(sp.get("r0").history.tokens) == 2000
    assert sp.get("r1").history is None and sp.get("off").history is None


def test_a_source_trusted_less_than_the_leading_draft_is_not_asked():
    """A sequence whose prediction is aligned (prior acceptance 0.85) does not pay for prompt
    lookup (0.5): its index is not built and not searched while the prediction leads, and the
    draft is the prediction's, as when every source was asked. Once the prediction is lost the
    lookup is asked and its index started."""
    rng = random.Random(6)
    prompt = _code_prompt(rng, 600)
    pred = prompt[200:260]
    sp = Speculator(SpeculationConfig(lookup_index_tokens_per_step=0))
    sp.add("r", prompt, prediction=pred)
    load = sp.load("r", 100)
    st = sp.get("r")
    assert load is not None and st.pending_source == "prediction"
    assert st.pending_draft == pred[:len(st.pending_draft)]
    assert st.history is None  # prompt lookup was not asked
    sp.append("r", [10 ** 6])  # a token the prediction does not hold: alignment lost
    assert st.pred_pos < 0
    sp.load("r", 100)
    assert st.history is not None and len(st.history.tokens) == 601
