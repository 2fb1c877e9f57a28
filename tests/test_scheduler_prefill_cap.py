"""Prefill budget by backlog (scheduler.capacity.PrefillCap, StepScheduler.schedule): while
sequences decode and few prompt tokens wait, a step carries at most the cap's prefill tokens; a
deep backlog, or no decodes, gets the whole max_num_batched_tokens; capped prompts still progress
every step; the flags reach the engine and the simulator; the engine's outputs do not change."""
from __future__ import annotations

import random

import pytest

from scheduler.capacity import CUDA_PREFILL_CAP_TOKENS, PrefillCap
from scheduler.step_scheduler import SchedulerConfig, StepResult, StepScheduler

BUDGET = 512


def _sched(cap: PrefillCap, num_blocks: int = 400, block_size: int = 16) -> StepScheduler:
    return StepScheduler(SchedulerConfig(max_model_len=4096, num_blocks=num_blocks, max_num_seqs=64,
                                         max_num_batched_tokens=BUDGET, block_size=block_size,
                                         enable_prefix_caching=False, prefill_cap=cap))


def _step(s: StepScheduler):
    plan = s.schedule()
    finished = s.update(plan, StepResult(sampled={c.request_id: 1 for c in plan.chunks if c.sample}))
    s.check_integrity()
    return plan, finished


def _prefill_tokens(plan) -> int:
    return sum(len(c.token_ids) for c in plan.chunks if c.is_prefill)


def _decoding(s: StepScheduler, n: int, max_tokens: int = 200) -> None:
    """n requests of 8 tokens, prefilled (one step, nothing decodes yet) and decoding."""
    for i in range(n):
        assert s.add_request(f"d{i}", [7] * 8, max_tokens, 0.0) is None
    plan, _ = _step(s)
    assert _prefill_tokens(plan) == 8 * n
    assert s.decodes.num_decoding == n


def test_a_small_backlog_behind_decodes_is_prefilled_at_the_cap_every_step():
    s = _sched(PrefillCap(max_tokens=64))
    _decoding(s, 3)
    assert s.add_request("long", [5] * 300, 4, 1.0) is None
    sizes = []
    while s.requests["long"].is_prefilling or not sizes:
        plan, _ = _step(s)
        sizes.append(_prefill_tokens(plan))
        assert plan.num_decodes == 3
        assert plan.num_batched_tokens == 3 + sizes[-1]
    # no starvation: every step moves it by the cap, the last by what is left
    assert sizes == [64, 64, 64, 64, 44]


def test_without_the_rule_the_same_prompt_is_one_step():
    s = _sched(PrefillCap())
    _decoding(s, 3)
    assert s.add_request("long", [5] * 300, 4, 1.0) is None
    plan, _ = _step(s)
    assert _prefill_tokens(plan) == 300


def test_no_decodes_means_the_whole_budget():
    """Nobody's next token waits for the step: a lone prompt is prefilled at the full budget."""
    s = _sched(PrefillCap(max_tokens=64))
    assert s.add_request("long", [5] * 300, 4, 0.0) is None
    plan, _ = _step(s)
    assert _prefill_tokens(plan) == 300


def test_a_deep_backlog_by_tokens_gets_the_full_budget_until_it_is_small():
    s = _sched(PrefillCap(max_tokens=64, backlog_tokens=BUDGET, backlog_seqs=100))
    _decoding(s, 2)
    for i in range(3):  # 3 x 250 = 750 tokens > one budget of 512
        assert s.add_request(f"p{i}", [5] * 250, 4, 1.0) is None
    plan, _ = _step(s)
    assert _prefill_tokens(plan) == BUDGET - 2  # deep: the whole budget, decodes included
    assert s.prefill_backlog() == 750 - 510
    plan, _ = _step(s)  # 240 left, at most one budget: capped
    assert _prefill_tokens(plan) == 64


def test_a_backlog_of_many_requests_gets_the_full_budget():
    """The 16/32 x256 burst's tail: many short prompts, few tokens. Capping it would add steps
    that every running stream waits through, so more than backlog_seqs requests is deep."""
    s = _sched(PrefillCap(max_tokens=64, backlog_seqs=4))
    _decoding(s, 2)
    for i in range(5):
        assert s.add_request(f"p{i}", [5] * 20, 4, 1.0) is None
    plan, _ = _step(s)
    assert _prefill_tokens(plan) == 100  # 5 requests > 4: all of them at once
    s = _sched(PrefillCap(max_tokens=64, backlog_seqs=4))
    _decoding(s, 2)
    for i in range(4):
        assert s.add_request(f"p{i}", [5] * 20, 4, 1.0) is None
    plan, _ = _step(s)
    assert _prefill_tokens(plan) == 64  # 4 requests: small, capped (the 4th one split)
    assert [len(c.token_ids) for c in plan.chunks if c.is_prefill] == [20, 20, 20, 4]


def test_the_default_rule_is_off_and_plans_are_unchanged():
    """PrefillCap() is off: the same random run plans the same steps as a config without it."""
    def run(cfg_cap):
        rng = random.Random(5)
        s = _sched(cfg_cap, num_blocks=60, block_size=4)
        out = []
        for t in range(120):
            if rng.random() < 0.6:
                s.add_request(f"r{t}", [rng.randrange(50) for _ in range(rng.randint(1, 60))],
                              rng.randint(1, 60), float(t))
            if s.has_unfinished():
                plan, _ = _step(s)
                out.append([(c.request_id, len(c.token_ids), c.start_pos) for c in plan.chunks])
        return out, s.num_preemptions

    off, preempts = run(PrefillCap())
    assert preempts >= 1  # the small pool preempts: the waiting-token count is exercised
    assert run(PrefillCap(max_tokens=0, backlog_tokens=1, backlog_seqs=0)) == (off, preempts)
    capped, _ = run(PrefillCap(max_tokens=8))
    assert capped != off


def test_waiting_token_count_stays_exact_under_preemption_and_aborts():
    """check_integrity compares the O(1) count with the waiting queue after every step."""
    rng = random.Random(11)
    s = _sched(PrefillCap(max_tokens=16, backlog_tokens=200, backlog_seqs=3), num_blocks=40,
               block_size=4)
    live = []
    for t in range(300):
        if rng.random() < 0.5:
            rid = f"r{t}"
            if s.add_request(rid, [rng.randrange(50) for _ in range(rng.randint(1, 60))],
                             rng.randint(1, 20), float(t)) is None:
                live.append(rid)
        if live and rng.random() < 0.1:
            s.abort(live.pop(rng.randrange(len(live))))
            s.check_integrity()
        if s.has_unfinished():
            _, finished = _step(s)
            done = {f.request_id for f in finished}
            live = [r for r in live if r not in done]
    assert s.num_preemptions >= 1
    while s.has_unfinished():
        _step(s)
    assert s.num_waiting_tokens == 0 and s.block_manager.num_used_blocks == 0


def test_bad_values_are_refused():
    for bad in ({"max_tokens": -1}, {"backlog_tokens": -1}, {"backlog_seqs": -1}):
        with pytest.raises(ValueError):
            PrefillCap(**bad)


# ---- the flags: `tidegate backend` / `serve` and the simulator -----------------------------------


def test_backend_flags_reach_the_engine_config():
    from backend.engine.args import backend_config
    from backend.errors import ModelLoadError
    from backend.server.cli import serve_parser

    ns = serve_parser().parse_args(["--max-prefill-tokens-while-decoding", "256",
                                    "--prefill-backlog-seqs", "6"])
    assert backend_config(ns).prefill_cap == PrefillCap(256, None, 6)
    assert backend_config(serve_parser().parse_args([])).prefill_cap == PrefillCap()
    # a CUDA backend caps at 256 unless told otherwise; 0 turns it off there too
    cuda = serve_parser().parse_args(["--device", "cuda"])
    assert backend_config(cuda).prefill_cap == PrefillCap(CUDA_PREFILL_CAP_TOKENS) == PrefillCap(256)
    off = serve_parser().parse_args(["--device", "cuda:1", "--max-prefill-tokens-while-decoding", "0"])
    assert backend_config(off).prefill_cap == PrefillCap()
    ns = serve_parser().parse_args(["--prefill-backlog-tokens", "-3"])
    with pytest.raises(ModelLoadError, match="backlog"):
        backend_config(ns)


def test_serve_forwards_the_flags_to_its_backend():
    from gateway.serve import build_parser, embedded_backend_argv

    args = build_parser().parse_args(["--max-prefill-tokens-while-decoding", "256"])
    argv = embedded_backend_argv(args, "ipc:///tmp/z.sock")
    assert argv[argv.index("--max-prefill-tokens-while-decoding") + 1] == "256"


def test_simulator_flags_reach_the_scheduler():
    import argparse

    from sims.options import add_run_args, parse_with_config, spec_from_args

    p = argparse.ArgumentParser()
    add_run_args(p)
    spec = spec_from_args(parse_with_config(p, ["--max-prefill-tokens-while-decoding", "128",
                                                "--prefill-backlog-tokens", "1024"]))
    assert spec.scheduler.prefill_cap == PrefillCap(128, 1024, 4)
    assert spec.scheduler.scheduler_config(100).prefill_cap == PrefillCap(128, 1024, 4)


# ---- the engine: same greedy tokens, capped steps ------------------------------------------------


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-standin"])
def test_engine_with_the_cap_gives_the_same_greedy_tokens(graphs):
    """The tiny model on the CPU, eager and through the stand-in of the CUDA graphs, synchronous
    and async turns: with a cap of 8 the tokens equal the uncapped engine's, and while anything
    decodes no step carries more than 8 prefill tokens unless the backlog was deep (then the
    whole budget)."""
    import torch

    from backend.engine.assemble import BackendConfig, create_engine
    from backend.kernels.reference.attention import TorchAttention
    from backend.runner.cuda_graphs import StepGraphs
    from backend.runner.sampler import SamplingParams

    def engine(cap: PrefillCap):
        e, _ = create_engine(BackendConfig(model="tiny", num_blocks=64, block_size=4, max_num_seqs=6,
                                           max_num_batched_tokens=40, max_model_len=256,
                                           prefill_cap=cap))
        e.runner.model.attn = TorchAttention(e.runner.model.config.head_dim ** -0.5)
        if graphs:
            e.runner.graphs = StepGraphs(e.runner, (1, 2, 4, 8), use_cuda_graphs=False,
                                         token_buckets=(8, 16, 32))
        return e

    def run(e, turn, plans):
        real = e.scheduler.schedule

        def spy(*args, **kw):
            s = e.scheduler
            small = (s.decodes.num_decoding > 0 and len(s.waiting) + len(s.prefilling) <= 4
                     and s.prefill_backlog() <= 40)
            plan = real(*args, **kw)
            plans.append((small, _prefill_tokens(plan)))
            return plan

        e.scheduler.schedule = spy
        g = torch.Generator().manual_seed(4)
        vocab = e.runner.model.config.vocab_size
        out: dict[str, list[int]] = {}
        reqs = [(f"r{i}", torch.randint(0, vocab, (n,), generator=g).tolist())
                for i, n in enumerate((6, 30, 3, 25, 11))]
        for i in range(60):
            if i < len(reqs):  # one arrival per turn: arrivals meet running decodes
                assert e.add_request(reqs[i][0], reqs[i][1],
                                     SamplingParams(max_tokens=7, ignore_eos=True)) is None
            for o in turn(e)():
                out.setdefault(o.request_id, []).extend(o.new_token_ids)
            if i >= len(reqs) and not e.has_unfinished():
                break
        e.check_integrity()
        return out

    ref = run(engine(PrefillCap()), lambda e: e.step, [])
    for async_turns in (False, True):
        e = engine(PrefillCap(max_tokens=8))
        e.async_scheduling = async_turns
        plans = []
        assert run(e, (lambda e: e.advance) if async_turns else (lambda e: e.step), plans) == ref
        # decodes running, at most 4 requests and one budget (40) pending: capped; else not
        assert max(p for small, p in plans if small) == 8
        assert max(p for small, p in plans if not small) > 8
        assert e.scheduler.block_manager.num_used_blocks == 0
