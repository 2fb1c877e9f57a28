"""The draft proposers and the speculation policy (scheduler.speculation), in microseconds."""
from __future__ import annotations

import argparse

import pytest

from scheduler.speculation import (
    NgramIndex,
    SeqLoad,
    SessionStore,
    SpeculationConfig,
    SpeculationPolicy,
    Speculator,
    StepCostModel,
    accept_drafts,
    add_speculation_arguments,
    drafts_worth,
    expected_tokens,
    speculation_config_from_args,
)


# ---- n-gram index ---------------------------------------------------------------------------
def test_ngram_index_finds_the_latest_longest_match():
    idx = NgramIndex(2, 3, [1, 2, 3, 9, 1, 2, 4, 5])
    assert idx.lookup([1, 2]) == 6  # latest (1, 2) is at 4, continues at 6
    assert idx.lookup([9, 1, 2]) == 6
    assert idx.lookup([3, 1, 2]) == 6  # no (3,1,2): falls back to (1,2)
    assert idx.lookup([7, 7]) == -1
    assert idx.lookup([5]) == -1  # shorter than n_min
    idx.extend([1, 2])  # the suffix itself is not its own match
    assert idx.lookup(idx.tokens) == 6


# ---- prediction -------------------------------------------------------------------------------
def spec(**kw) -> Speculator:
    return Speculator(SpeculationConfig(**kw))


def test_prediction_drafts_follow_the_output_and_resync_after_an_edit():
    pred = list(range(100, 140))
    sp = spec(resync_ngram=3)
    sp.add("r", [1, 2, 3], prediction=pred)
    assert sp.propose("r", 4) == [100, 101, 102, 103]
    assert sp.get("r").last_source == "prediction"
    sp.append("r", [100, 101, 102])
    assert sp.propose("r", 3) == [103, 104, 105]
    # the model rewrites 103..105 as 7, 8 (an edited line), then is back on 106, 107, 108
    sp.append("r", [7, 8])
    assert sp.get("r").pred_pos == -1
    assert sp.propose("r", 2) != [106, 107]  # lost: no prediction draft
    sp.append("r", [106, 107, 108])
    assert sp.get("r").pred_pos == 109 - 100
    assert sp.propose("r", 3) == [109, 110, 111]
    sp.append("r", list(range(109, 140)))
    st = sp.get("r")  # 103, 104, 105 were not used: OpenAI's rejected_prediction_tokens
    assert st.num_matched_prediction_tokens == 37 and st.prediction_unused() == 3


def test_prediction_resync_prefers_the_place_after_the_alignment():
    pred = [5, 6, 7, 1, 5, 6, 7, 2]
    sp = spec(resync_ngram=3, sources=("prediction",))
    sp.add("r", [0], prediction=pred)
    sp.append("r", [5, 6, 7, 1])  # aligned to index 4
    sp.append("r", [9, 5, 6, 7])  # off, then (5, 6, 7) again: the one after index 4
    assert sp.get("r").pred_pos == 7
    assert sp.propose("r", 5) == [2]


def test_prediction_counters_follow_verifies():
    sp = spec()
    sp.add("r", [1], prediction=[10, 11, 12, 13, 14, 15])
    assert sp.propose("r", 4) == [10, 11, 12, 13]
    sp.verified("r", 4, 2)
    st = sp.get("r")
    assert (st.num_draft_tokens, st.num_accepted_draft_tokens) == (4, 2)
    assert (st.num_accepted_prediction_tokens, st.num_rejected_prediction_tokens) == (2, 2)
    assert st.prediction_unused() == 6  # nothing of it in the output yet
    sp.append("r", [10, 11, 99])
    assert st.num_matched_prediction_tokens == 2 and st.prediction_unused() == 4
    assert sp.stats()["drafted"]["prediction"] == 4


# ---- prompt lookup and sessions -------------------------------------------------------------------
def test_prompt_lookup_proposes_what_followed_the_suffix():
    prompt = [1, 2, 3, 4, 5, 6, 9, 9]
    sp = spec(sources=("prompt",))
    sp.add("r", prompt)
    sp.append("r", [2, 3])
    assert sp.propose("r", 3) == [4, 5, 6]
    sp.append("r", [4])  # (2, 3, 4) -> 5, 6, 9
    assert sp.propose("r", 3) == [5, 6, 9]
    sp.append("r", [42])
    assert sp.propose("r", 3) == []


def test_session_store_drafts_from_an_earlier_output_of_the_same_prefix():
    cfg = {"sources": ("session",), "session_prefix_tokens": 4}
    sp = spec(**cfg)
    prompt = [7, 7, 7, 7, 1]
    sp.add("a", prompt)
    sp.append("a", [20, 21, 22, 23, 24])
    sp.finish("a")
    assert len(sp.sessions) == 1
    sp.add("b", prompt[:4] + [2])  # same first 4 tokens: same session
    sp.append("b", [21, 22])
    assert sp.propose("b", 2) == [23, 24]
    assert sp.get("b").last_source == "session"
    sp.add("c", [8, 8, 8, 8])  # another session
    sp.append("c", [21, 22])
    assert sp.propose("c", 2) == []


def test_session_store_is_bounded():
    store = SessionStore(2, 3, max_sessions=2, max_tokens=10)
    for key in range(3):
        store.record(key, list(range(8)))
    assert len(store) == 2 and store.get(0) is None
    store.record(1, list(range(100, 108)))
    # over the cap: the session keeps what came since it passed half its cap (its shadow index:
    # nothing yet) and the new output, newest last
    assert store.get(1).tokens == list(range(100, 108))


def test_a_session_at_its_cap_is_never_re_indexed(monkeypatch):
    """A long session costs the serving loop the same per token at its cap as below it: each
    token is indexed at most twice (the index and its shadow), no finish re-indexes the session
    (cutting to the cap rebuilt a 65K-token index at every finish: 34 ms each), and lookups
    still see the latest half cap or more."""
    import scheduler.speculation as spec_mod
    indexed = []
    extend = spec_mod.NgramIndex.extend

    def counting(self, new):
        new = list(new)
        indexed[-1] += len(new)
        return extend(self, new)

    monkeypatch.setattr(spec_mod.NgramIndex, "extend", counting)
    store = SessionStore(2, 4, max_tokens=1000)
    for i in range(100):  # 100 answers of 50 tokens: 5,000 tokens through a 1,000-token cap
        out = [(i * 50 + j) % 997 for j in range(50)]
        indexed.append(0)
        store.record(7, out)
        index = store.get(7)
        assert indexed[-1] <= 2 * 50
        assert len(index.tokens) <= 1000 and index.tokens[-50:] == out
        if i >= 10:
            assert len(index.tokens) >= 500
    assert sum(indexed) <= 2 * 5000
    index = store.get(7)
    assert index.lookup(index.tokens[-60:-56]) == len(index.tokens) - 56  # finds the latest


def test_off_and_disabled_propose_nothing():
    sp = spec()
    sp.add("r", [1, 2, 1, 2], off=True)
    sp.append("r", [1, 2])
    assert sp.propose("r", 4) == []
    sp2 = Speculator(SpeculationConfig(enabled=False))
    sp2.add("r", [1, 2, 1, 2], prediction=[1, 2])
    assert sp2.propose("r", 4) == []
    assert sp2.load("r", 10, ()) is None  # nothing for the policy to weigh


def test_load_picks_the_most_trusted_source_with_a_draft():
    sp = spec()
    sp.add("r", [5, 6, 7, 8, 5, 6], prediction=[7, 8, 9, 9, 9])
    load = sp.load("r", 50)  # prediction (prior 0.85) beats prompt lookup (0.5)
    assert load.alpha == pytest.approx(0.85) and load.max_draft_tokens == 5
    st = sp.get("r")
    for _ in range(5):  # the prediction keeps failing for this request
        st.last_source = "prediction"
        sp.verified("r", 5, 0)
    load = sp.load("r", 50)
    assert st.pending_source == "prompt" and load.max_draft_tokens == 4  # (7, 8, 5, 6)
    assert sp.propose("r", 2) == [7, 8] and st.last_source == "prompt"


# ---- acceptance ----------------------------------------------------------------------------------
def test_measured_acceptance_moves_alpha_and_the_draft_count():
    sp = spec(sources=("prompt",))
    sp.add("r", [1, 2, 3, 1, 2, 3])
    start = sp.alpha(sp.get("r"))
    for _ in range(10):
        sp.get("r").last_source = "prompt"
        sp.verified("r", 4, 0)
    low = sp.alpha(sp.get("r"))
    assert low < start * 0.3
    assert drafts_worth(low, 8, sp.config.min_draft_prob) == 0
    sp.add("s", [1])
    for _ in range(10):
        sp.get("s").last_source = "prompt"
        sp.verified("s", 4, 4)
    assert sp.alpha(sp.get("s")) > 0.85


def test_drafts_worth_and_expected_tokens():
    assert drafts_worth(0.9, 8, 0.15) == 8
    assert drafts_worth(0.5, 8, 0.15) == 2  # 0.25 >= 0.15 > 0.125
    assert drafts_worth(0.1, 8, 0.15) == 0
    assert drafts_worth(1.0, 5, 0.15) == 5
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert accept_drafts([1, 2, 3], [1, 2, 9, 4]) == 2
    assert accept_drafts([1, 2], [1, 2, 3]) == 2
    assert accept_drafts([5], [1, 2]) == 0


# ---- the policy ------------------------------------------------------------------------------------
def loads(n, alpha=0.9, remaining=200, cap=0):
    return [SeqLoad(f"r{i}", remaining, alpha, cap, (0, float(i), i)) for i in range(n)]


def test_policy_speculates_with_slack_and_not_at_saturation():
    pol = SpeculationPolicy(SpeculationConfig(knee_tokens=128, max_draft_tokens=8))
    light = pol.plan(loads(4, remaining=50), num_decodes=4, num_prefill_tokens=0)
    assert light == {f"r{i}": 8 for i in range(4)}  # 0.9^8 = 0.43 >= 0.15
    # 100 decodes: 28 tokens free under the knee, then each costs 1/128 of the step: the first
    # drafts of 28 sequences (q = 0.9 each) beat more drafts of a few
    mid = pol.plan(loads(100, remaining=50), num_decodes=100, num_prefill_tokens=0)
    assert sum(mid.values()) == 28 and set(mid.values()) == {1} and "r99" not in mid
    assert pol.plan(loads(128), num_decodes=128, num_prefill_tokens=0) == {}
    assert pol.saturated(128) and not pol.saturated(127)
    # a big prefill in the step: its tokens are work too; a draft does not pay its share
    assert pol.plan(loads(4), num_decodes=4, num_prefill_tokens=2000) == {}
    assert pol.num_steps_off_by_load == 2


def test_policy_classes_weigh_drafts_and_caps_hold():
    pol = SpeculationPolicy(SpeculationConfig(knee_tokens=128, max_draft_tokens=8))
    seqs = [SeqLoad("slow", 500, 0.95, 0, (0, 0.0, 0)),
            SeqLoad("normal", 40, 0.6, 0, (0, 1.0, 1)),
            SeqLoad("fast", 6, 0.9, 0, (0, 2.0, 2))]
    out = pol.plan(seqs, num_decodes=3, num_prefill_tokens=0)
    assert out["fast"] == 5  # remaining - 1
    assert out["normal"] == drafts_worth(0.6, 8, 0.15) == 3
    assert out["slow"] == 8  # 0.8 * 0.95^8 = 0.53
    # limited rows go to the best drafts first: fast and slow's first ones (0.9, 0.76)
    few = pol.plan(seqs, num_decodes=3, num_prefill_tokens=0, max_rows=3)
    assert few == {"fast": 2, "slow": 1}
    # the per-class cap
    pol2 = SpeculationPolicy(SpeculationConfig(class_max=(8, 8, 2)))
    assert pol2.plan([SeqLoad("s", 500, 0.99, 0)], 1, 0) == {"s": 2}


def test_policy_per_request_cap_and_off():
    pol = SpeculationPolicy(SpeculationConfig(max_draft_tokens=8))
    seqs = [SeqLoad("capped", 50, 0.99, 3), SeqLoad("off", 50, 0.99, -1)]
    assert pol.plan(seqs, 2, 0) == {"capped": 3}
    assert pol.plan(seqs, 2, 0, max_rows=2) == {"capped": 2}
    assert SpeculationPolicy(SpeculationConfig(enabled=False)).plan(seqs, 2, 0) == {}


def test_policy_uses_the_measured_step_cost():
    cost = StepCostModel(slack=0.25)
    for _ in range(3):
        cost.observe(1, 0.010)
        cost.observe(16, 0.011)
        cost.observe(64, 0.012)
        cost.observe(256, 0.030)
    # 12 ms at 64, 30 ms at 256: the line crosses 12.5 ms at 64 + 0.5 / 18 * 192
    assert cost.knee() == 69
    assert cost.time(1) == 0.010 and cost.time(40) == pytest.approx(0.0115)
    assert cost.time(512) == pytest.approx(0.060)  # past the last: proportional at least
    pol = SpeculationPolicy(SpeculationConfig(knee_tokens=1000, max_draft_tokens=8), cost)
    assert pol.knee() == 69
    # c = 1: drafts are nearly free (1/15 ms a token against a 10 ms step)
    assert pol.plan(loads(1, alpha=0.9, remaining=50), 1, 0) == {"r0": 8}
    # 200 decodes: a token costs 0.094 ms of a 26 ms step (work 200): only q > 0.72 pays
    assert pol.plan(loads(200, alpha=0.6, remaining=50), 200, 0) == {}
    assert StepCostModel().knee() is None and StepCostModel().time(5) is None
    # only a decode and a big prefill measured: the knee is where their line crosses the slack
    cost2 = StepCostModel(slack=0.25)
    for _ in range(3):
        cost2.observe(1, 0.030)
        cost2.observe(384, 0.130)
    assert cost2.knee() == 1 + int(0.0075 / 0.100 * 511)  # 39 (384 tokens: the 512 bucket)


def test_fixed_cost_of_a_speculating_step_must_be_paid():
    pol = SpeculationPolicy(SpeculationConfig(knee_tokens=128))
    one = [SeqLoad("a", 50, 0.2, 0)]  # one draft worth 0.2 of a token
    assert pol.plan(one, 1, 0) == {"a": 1}
    assert pol.plan(one, 1, 0, fixed_s=0.5) == {}  # a step 50% longer for 20% more tokens


def test_speculator_plan_end_to_end():
    sp = spec(knee_tokens=64)
    sp.add("a", [1, 2, 3], prediction=[4, 5, 6, 7, 8, 9])
    sp.add("b", [1, 2, 3, 4, 1, 2])
    sp.append("b", [3])
    got = sp.plan([sp.load("a", 50), sp.load("b", 50)], num_decodes=2, num_prefill_tokens=0)
    assert got["a"] == [4, 5, 6, 7, 8, 9]
    assert got["b"][:2] == [4, 1]


def test_flags_round_trip():
    p = argparse.ArgumentParser()
    add_speculation_arguments(p)
    cfg = speculation_config_from_args(p.parse_args(
        ["--speculation", "off", "--speculation-max-draft-tokens", "3",
         "--speculation-sources", "prompt,prediction", "--speculation-knee-tokens", "32"]))
    assert cfg == SpeculationConfig(enabled=False, max_draft_tokens=3,
                                    sources=("prompt", "prediction"), knee_tokens=32)
    with pytest.raises(ValueError, match="unknown speculation sources"):
        SpeculationConfig(sources=("bogus",))


def test_only_big_steps_measured_is_not_a_free_ride():
    """A cold server's first measured steps are whole prompts: with only 2,048- and 4,096-token
    steps measured, a 256-decode step must not look as costly as a 2,048-token one (every draft
    free): below the smallest measured bucket the time scales down by the prior's shape."""
    cost = StepCostModel()
    for _ in range(3):
        cost.observe(2048, 0.200)
        cost.observe(4096, 0.400)
    pol = SpeculationPolicy(SpeculationConfig(knee_tokens=128, max_draft_tokens=8), cost)
    assert cost.prior_knee == 128
    assert pol.step_time(256) == pytest.approx(0.025)
    assert pol.step_time(64) == pytest.approx(0.0125)  # flat below the prior knee
    assert pol.saturated(256)
    assert pol.plan(loads(256, alpha=0.9, remaining=100), 256, 0) == {}
    # a single decode still speculates (below the prior knee a token is nearly free)
    assert pol.plan(loads(1, alpha=0.9, remaining=100), 1, 0) == {"r0": 8}


def test_prediction_counts_never_count_a_predicted_token_twice():
    """Hand-computed: prediction A..H, output ABCD ABCD. The second ABC re-synchronises back to
    the prediction's start (the n-gram's only place): the running count must not count A..D
    again (it said 8 accepted, 0 unused before); OpenAI's usage: 4 accepted, 4 rejected."""
    A, B, C, D, E, F, G, H = range(10, 18)
    sp = spec(resync_ngram=3, sources=("prediction",))
    sp.add("r", [1], prediction=[A, B, C, D, E, F, G, H])
    sp.append("r", [A, B, C, D])
    sp.append("r", [A, B, C, D])
    st = sp.get("r")
    assert st.num_matched_prediction_tokens == 4 and st.prediction_unused() == 4
    assert st.prediction_passed_over() == 0  # E..H are still ahead of the alignment
    assert st.prediction_usage() == (4, 4)
    # an edit: E F replaced by two other tokens, then G H: the n-gram (G, H) re-synchronises,
    # both count; E and F are passed over
    sp2 = spec(resync_ngram=2, sources=("prediction",))
    sp2.add("r", [1], prediction=[A, B, C, D, E, F, G, H])
    sp2.append("r", [A, B, C, D, 90, 91, G, H])
    st2 = sp2.get("r")
    assert (st2.num_matched_prediction_tokens, st2.prediction_passed_over()) == (6, 2)
    assert st2.prediction_usage() == (6, 2)


def test_back_off_ends_when_a_prediction_finds_its_place():
    """DraftBackoff: 1, 3, 7, 15, 16 turns without asking after asks that drafted nothing;
    a prediction that re-synchronises (or a request that brings one) ends the wait."""
    sp = spec(resync_ngram=3, sources=("prediction",))
    b = sp.backoff
    waits = []
    for _ in range(6):
        b.asked(False)
        waits.append(b.wait)
        b.wait = 0
    assert waits == [1, 3, 7, 15, 16, 16]
    sp.add("r", [1], prediction=list(range(100, 140)))  # a new prediction: ask at once
    assert not b.skip() and b.backoff == 0
    sp.append("r", [100, 101, 7, 8, 9])  # an edited line: lost, nothing to draft
    assert sp.get("r").pred_pos == -1 and sp.propose("r", 4) == []
    b.asked(False)
    b.asked(False)
    assert b.wait == 3
    sp.append("r", [105])  # still lost: the back-off runs on
    assert b.skip() and b.wait == 2
    sp.append("r", [106, 107])  # (105, 106, 107) re-synchronises
    assert sp.get("r").pred_pos == 8 and (b.wait, b.backoff) == (0, 0) and not b.skip()
    b.reset_on_align = False  # the rule before it (the simulator's --no-reset-on-resync)
    sp.append("r", [1, 2, 3])
    b.asked(False)
    sp.append("r", [109, 110, 111])
    assert sp.get("r").pred_pos >= 0 and b.wait == 1


def test_past_the_largest_measured_step_is_not_taken_as_compute_bound():
    """The H200's c=8 edit run: only decode steps (8 tokens) and 16-token verifies measured; a
    step of 17 tokens priced proportional (1/16 of a step a token) stopped every plan at 16
    tokens a step. Past the largest bucket the prior's shape applies: flat to the prior knee."""
    cost = StepCostModel()
    for _ in range(3):
        cost.observe(8, 0.0202)
        cost.observe(16, 0.0229)
    pol = SpeculationPolicy(SpeculationConfig(knee_tokens=128, max_draft_tokens=8), cost)
    plan = pol.plan(loads(8, alpha=0.95, remaining=200), 8, 0)
    assert sum(plan.values()) > 8 + 16  # not cut at 16 tokens a step
    # far past the prior knee a token costs its share again: no drafts at 400 decodes
    assert pol.plan(loads(400, alpha=0.95, remaining=200), 400, 0) == {}
