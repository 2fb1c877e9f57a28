"""The simulator's speculation (sims.speculation) against closed forms: the real StepScheduler
and the engine's Speculator on a virtual clock, verifies charged as short prefill chunks."""
from __future__ import annotations

import time

import numpy as np
import pytest

from scheduler.speculation import SpeculationConfig
from scheduler.step_plan import SchedulerConfig
from sims.cost import ConstantCost
from sims.edit_workload import alter_text, alter_tokens, token_lines
from sims.speculation import (
    OracleAcceptance,
    RateAcceptance,
    SpecRequest,
    TraceAcceptance,
    simulate_speculation,
    synthetic_edit_requests,
)

STEP = 0.010


def sched(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{"max_model_len": 4096, "num_blocks": 4096, "max_num_seqs": 256,
                              "max_num_batched_tokens": 2048, "block_size": 16, **kw})


def spec(k: int, **kw) -> SpeculationConfig:
    return SpeculationConfig(max_draft_tokens=k, **kw)


def one(prediction=True, output_len=1 + 5 * 20, **kw) -> SpecRequest:
    out = tuple(range(1000, 1000 + output_len))
    return SpecRequest(tuple(range(16)), out, out if prediction else None, **kw)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_full_acceptance_tpot_is_step_over_k_plus_1(k):
    n = 1 + (k + 1) * 12  # first token from the prefill, then verifies of k + 1 tokens
    res = simulate_speculation([one(output_len=n)], ConstantCost(STEP), sched(), spec(k),
                               OracleAcceptance(), concurrency=1)
    s = res.summary()
    assert s["tpot_p50_s"] == pytest.approx(STEP / (k + 1))
    assert s["acceptance_rate"] == 1.0 and s["verifies"] == 12
    assert res.outputs[0] == list(range(1000, 1000 + n))  # the same tokens as decoding


def test_off_is_one_token_per_step():
    for config, req in ((None, one()), (spec(4), one(off=True)), (spec(4), one(prediction=False)),
                        (spec(4), one(max_draft_tokens=0, off=True))):
        res = simulate_speculation([req], ConstantCost(STEP), sched(), config, concurrency=1)
        assert res.summary()["tpot_p50_s"] == pytest.approx(STEP)
        assert res.summary()["draft_tokens"] == 0


def test_per_request_cap():
    res = simulate_speculation([one(output_len=1 + 3 * 10, max_draft_tokens=2)],
                               ConstantCost(STEP), sched(), spec(8), concurrency=1)
    assert res.summary()["tpot_p50_s"] == pytest.approx(STEP / 3)


def test_rate_acceptance_matches_the_geometric_mean():
    alpha, k = 0.6, 4
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)  # tokens a verify yields on average
    reqs = [one(output_len=2001)]
    res = simulate_speculation(reqs, ConstantCost(STEP), sched(),
                               spec(k, min_draft_prob=0.01), RateAcceptance(alpha),
                               concurrency=1, seed=3)
    s = res.summary()
    assert s["mean_accepted_per_verify"] + 1 == pytest.approx(expected, rel=0.05)
    assert s["tpot_p50_s"] == pytest.approx(STEP / expected, rel=0.05)
    assert res.outputs[0] == list(reqs[0].output)


def test_trace_acceptance_estimates_per_position_rates():
    t = TraceAcceptance([(4, 4), (4, 2), (2, 0), (4, 4)])
    # position 0: reached 4 times, passed 3; position 2: reached by (4,4),(4,2),(4,4): 2 passed
    assert t.alpha[0] == pytest.approx(3 / 4) and t.alpha[2] == pytest.approx(2 / 3)
    assert t.alpha[3] == 1.0
    with pytest.raises(ValueError):
        TraceAcceptance([(0, 0)])


class KneeCost(ConstantCost):
    """A step costs `seconds` up to `knee` tokens, then `per_token` for each one past it."""

    def __init__(self, seconds, knee, per_token):
        super().__init__(seconds)
        self.knee, self.per_token = knee, per_token

    def step_time(self, d, p, c):
        n = d + p
        return 0.0 if n == 0 else self.seconds + self.per_token * max(0, n - self.knee)


def test_saturation_drafts_nothing_and_keeps_throughput():
    cost = KneeCost(STEP, knee=32, per_token=STEP / 32)
    reqs = [one(output_len=200) for _ in range(96)]
    on = simulate_speculation(reqs, cost, sched(), spec(8, knee_tokens=32), concurrency=64)
    off = simulate_speculation(reqs, cost, sched(), None, concurrency=64)
    s_on, s_off = on.summary(), off.summary()
    # the policy measures its knee from the steps (a bucket within 25% of the smallest step's
    # time: 32 or 64 tokens here, as measured), and while the decodes fill it, it drafts nothing
    assert s_on["output_throughput_tok_s"] >= 0.98 * s_off["output_throughput_tok_s"]
    busy = [d for d, st in zip(on.decisions, on.steps) if st[1] + st[2] >= 60]
    assert len(busy) > 100 and not any(busy)
    # at one request the same policy speculates hard
    one_on = simulate_speculation(reqs[:1], cost, sched(), spec(8, knee_tokens=32), concurrency=1)
    assert one_on.summary()["tpot_p50_s"] < 0.2 * STEP


def test_verify_is_charged_as_a_prefill_chunk():
    class Linear(ConstantCost):
        accepts_prefill_chunks = True

        def step_time(self, d, p, c, prefill_chunks=None):
            self.seen = prefill_chunks
            return 0.001 * d + 0.002 * p

    cost = Linear(0)
    res = simulate_speculation([one(output_len=1 + 5 * 3)], cost, sched(), spec(4),
                               concurrency=1)
    assert cost.seen == [(5, 16 + 1 + 5 * 2 - 1)]  # the last verify: 5 tokens at its position
    # prefill of 16 tokens, then 3 verifies of 5 tokens
    assert res.makespan == pytest.approx(0.002 * 16 + 3 * 0.002 * 5)


def test_oracle_edits_order_the_speedups():
    tpot = {}
    for keep in (1.0, 0.75, 0.5, 0.0):
        reqs = synthetic_edit_requests(4, 64, 400, keep, seed=1)
        res = simulate_speculation(reqs, ConstantCost(STEP), sched(), spec(8), concurrency=1)
        tpot[keep] = res.summary()["tpot_p50_s"]
        assert all(res.outputs[i] == list(r.output) for i, r in enumerate(reqs))
    assert tpot[1.0] < tpot[0.75] < tpot[0.5] < STEP
    assert tpot[1.0] == pytest.approx(STEP / 9, rel=0.02)


def test_alter_lines_text_and_tokens():
    text = "def f(x):\n    return x + 1\n\n    y = 2\nz = f(3)"
    same, n = alter_text(text, 1.0, seed=0)
    assert same == text and n == 0
    changed, n = alter_text(text, 0.5, seed=0)
    assert n == 2 and changed.count("\n") == text.count("\n")
    diff = [a != b for a, b in zip(text.split("\n"), changed.split("\n"))]
    assert sum(diff) == 2 and not diff[2]  # blank lines are left alone
    toks = [5, 6, 0, 7, 8, 0, 9, 0, 10]
    assert token_lines(toks, 0) == [(0, 3), (3, 6), (6, 8), (8, 9)]
    alt, n = alter_tokens(toks, 0.5, 0, 100, seed=np.random.default_rng(2))
    assert n == 2 and len(alt) == len(toks)
    assert [i for i, t in enumerate(alt) if t == 0] == [2, 5, 7]
    assert sum(a != b for a, b in zip(alt, toks)) in (3, 4)


def test_warmup_runs_first_on_the_same_backend():
    """The live oracle's baseline before its measured run: its prompts are cached by then."""
    class Linear(ConstantCost):
        def step_time(self, d, p, c):
            return 0.001 * d + 0.002 * p

    out = tuple(range(1000, 1021))
    reqs = [SpecRequest(tuple(range(40)), out, out)]
    cfg = sched(enable_prefix_caching=True)
    cold = simulate_speculation(reqs, Linear(0), cfg, spec(4), concurrency=1)
    warm = simulate_speculation(reqs, Linear(0), cfg, spec(4), concurrency=1,
                                warmup=[SpecRequest(r.prompt, r.output, off=True) for r in reqs])
    assert len(warm.records) == 1 and warm.outputs[0] == list(out)

    def ttft(res):
        return res.records[0].token_times[0] - res.records[0].arrival

    assert ttft(cold) == pytest.approx(0.002 * 40)
    assert ttft(warm) == pytest.approx(0.002 * 8)  # two of its three blocks cached


def test_warmup_sessions_leave_unless_kept():
    """After the baseline, the session store would draft the altered lines exactly (its output
    is the truth): bench flushes it live, the simulator drops it, unless asked to keep it."""
    reqs = synthetic_edit_requests(2, 80, 240, 0.5, seed=4)
    base = [SpecRequest(r.prompt, r.output, off=True) for r in reqs]
    args = (reqs, ConstantCost(STEP), sched(enable_prefix_caching=True), spec(8))
    flushed = simulate_speculation(*args, concurrency=1, warmup=base).summary()
    kept = simulate_speculation(*args, concurrency=1, warmup=base, keep_sessions=True).summary()
    assert kept["acceptance_rate"] > flushed["acceptance_rate"]
    assert kept["tpot_p50_s"] < flushed["tpot_p50_s"]


def test_async_turns_back_off_as_the_engine_does(monkeypatch):
    """With async scheduling the engine asks the policy only when drafting may pay, and after
    an ask that drafts nothing it stays pipelined for 1, 3, 7, 15, then 16 turns
    (backend.engine.continuous._may_speculate): the simulator asks on the same turns."""
    from scheduler.speculation import Speculator

    asks = []
    real = Speculator.plan

    def counting(self, *args, **kw):
        asks.append(1)
        return real(self, *args, **kw)

    monkeypatch.setattr(Speculator, "plan", counting)
    out = tuple(range(1000, 1100))  # nothing to draft: no prediction, no repeated n-gram
    reqs = [SpecRequest(tuple(range(16)), out)]
    simulate_speculation(reqs, ConstantCost(STEP), sched(), spec(8), concurrency=1,
                         async_scheduling=True)
    decode_turns, expected, wait, backoff = len(out) - 1, 0, 0, 0
    for _ in range(decode_turns):
        if wait:
            wait -= 1
            continue
        expected += 1
        backoff = min(16, 2 * backoff + 1)
        wait = backoff
    assert len(asks) == expected == 9
    asks.clear()
    simulate_speculation(reqs, ConstantCost(STEP), sched(), spec(8), concurrency=1)
    assert len(asks) == decode_turns  # the CPU engine asks every step


def test_back_off_reset_on_resync_recovers_the_edited_lines():
    """The engine's back-off would outlive an edited line (nothing to draft there); it ends
    when the prediction re-synchronises (scheduler.speculation.DraftBackoff, the engine's
    rule), which gives back what asking every step gets."""
    reqs = synthetic_edit_requests(4, 64, 400, 0.5, seed=2)
    base = [SpecRequest(r.prompt, r.output, off=True) for r in reqs]

    def tpot(**kw):
        return simulate_speculation(reqs, ConstantCost(STEP), sched(enable_prefix_caching=True),
                                    spec(8), concurrency=1, warmup=base,
                                    **kw).summary()["tpot_p50_s"]

    before, resync, every = (tpot(async_scheduling=True, reset_on_resync=False),
                             tpot(async_scheduling=True), tpot())
    assert resync < before and resync == pytest.approx(every, rel=0.02)


def test_measured_host_turn_charges_drafting_steps_their_own_planning(monkeypatch):
    """`host_turn="measured"`: a drafting step (not pipelined under async scheduling) waits for
    the host's turn before it, charged as the wall time the simulator's own run of the engine's
    code took: a planning made 2 ms slower shows up in each drafting step and in TPOT; the
    default (one more launch from the profile: none for a constant cost) charges none of it,
    and a pipelined run (no drafts) none either way."""
    from scheduler.speculation import Speculator

    real = Speculator.plan

    def slow_plan(self, *a, **kw):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass
        return real(self, *a, **kw)

    monkeypatch.setattr(Speculator, "plan", slow_plan)
    reqs = [one()]

    def run(**kw):
        return simulate_speculation(reqs, ConstantCost(STEP), sched(), spec(4), concurrency=1,
                                    async_scheduling=True, **kw)

    launch, measured = run(), run(host_turn="measured")
    assert launch.summary()["host_turn_ms_mean"] == 0.0
    turn = measured.summary()["host_turn_ms_mean"]
    assert turn >= 2.0
    assert measured.summary()["tpot_p50_s"] > launch.summary()["tpot_p50_s"]
    # every step drafted (a full prediction): each step's time is STEP plus its turn
    assert all(s[0] >= STEP + 0.002 for s, d in zip(measured.steps, measured.decisions) if d)
    plain = simulate_speculation(reqs, ConstantCost(STEP), sched(), None, concurrency=1,
                                 async_scheduling=True, host_turn="measured")
    assert plain.summary()["host_turn_ms_mean"] is None
    with pytest.raises(ValueError, match="host_turn"):
        run(host_turn="sometimes")
