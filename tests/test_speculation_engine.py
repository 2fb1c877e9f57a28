"""Speculative decoding through the engine on the CPU (issue 28): verify chunks of draft tokens
in eager and graph (CPU stand-in) steps, KV rollback, and outputs identical to decoding without
speculation — greedy, seeded sampling, penalties, min_tokens, stop tokens, logprobs — plus the
sampled distribution (chi-square) and the block accounting after rejections and aborts."""
from __future__ import annotations

import math

import pytest
import torch

from backend.engine.assemble import BackendConfig, create_engine
from backend.kernels.reference.attention import TorchAttention
from backend.kv.pools import FILL_BLOCK_ENV
from backend.runner.cuda_graphs import StepGraphs
from backend.runner.sampler import SamplingParams
from evals.engine import sequence_logits
from scheduler.speculation import SpeculationConfig, Speculator, StepCostModel


def _engine(spec: SpeculationConfig | None, graphs: bool = False, kv: str = "auto",
            torch_attention: bool = True, num_blocks: int = 96, max_num_seqs: int = 16,
            model: str = "tiny", **kw):
    engine, _ = create_engine(BackendConfig(model=model, num_blocks=num_blocks, block_size=4,
                                            max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
                                            max_model_len=256, kv_cache_dtype=kv, **kw))
    if torch_attention:  # the same op order on every path: greedy ids compare exactly
        engine.runner.model.attn = TorchAttention(engine.runner.model.config.head_dim ** -0.5)
    if graphs:  # the CPU stand-in of the CUDA graphs (decode buckets, mixed token buckets)
        engine.runner.graphs = StepGraphs(engine.runner, (1, 2, 4, 8), use_cuda_graphs=False,
                                          token_buckets=(8, 16, 32, 64))
    if spec is not None:
        engine.speculator = Speculator(spec, StepCostModel())
    return engine


def _run(engine, reqs, predictions=None, turn="step"):
    """Serve {rid: (prompt, params)}; returns {rid: (tokens, reason, logprobs, last record)}."""
    predictions = predictions or {}
    for rid, (prompt, params) in reqs.items():
        assert engine.add_request(rid, prompt, params, prediction=predictions.get(rid)) is None
    out = {rid: [[], None, [], None] for rid in reqs}
    steps = 0
    fn = getattr(engine, turn)
    while engine.has_unfinished():
        for o in fn():
            rec = out[o.request_id]
            assert rec[1] is None, "tokens after the finish"
            rec[0].extend(o.new_token_ids)
            rec[2].extend(lp.logprob for lp in o.logprobs)
            rec[1], rec[3] = o.finish_reason, o
        if engine._inflight is None:  # (mid-flight, a verify's draft slots are still reserved)
            engine.check_integrity()
        steps += 1
        assert steps < 5000
    assert engine.scheduler.block_manager.num_used_blocks == 0, "a block leaked"
    return out, steps


def _prompts(n, vocab, seed=0, repetitive=True):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        base = torch.randint(0, vocab, (5 + 3 * i,), generator=g).tolist()
        out.append(base * 3 if repetitive else base)  # repeats: prompt lookup finds drafts
    return out


SPEC = SpeculationConfig(max_draft_tokens=6, knee_tokens=64, min_draft_prob=0.01)


def _greedy_case(engine_kw, params_kw=None, n=5, seed=0):
    base_engine = _engine(None, **engine_kw)
    vocab = base_engine.runner.model.config.vocab_size
    prompts = _prompts(n, vocab, seed)
    params = [SamplingParams(max_tokens=20 + 3 * i, ignore_eos=True, **(params_kw or {}))
              for i in range(n)]
    reqs = {f"r{i}": (p, params[i]) for i, p in enumerate(prompts)}
    base, base_steps = _run(base_engine, reqs)
    # predictions: the exact output for even requests, one token in eight altered for odd ones
    preds = {}
    for i, rid in enumerate(reqs):
        toks = list(base[rid][0])
        if i % 2:
            toks = [t if j % 8 != 7 else (t + 1) % vocab for j, t in enumerate(toks)]
        preds[rid] = toks
    spec_engine = _engine(SPEC, **engine_kw)
    spec, spec_steps = _run(spec_engine, reqs, preds)
    return base, spec, base_steps, spec_steps, spec_engine


@pytest.mark.parametrize("graphs", [False, True])
def test_greedy_identical_with_predictions_and_prompt_lookup(graphs):
    base, spec, base_steps, spec_steps, eng = _greedy_case({"graphs": graphs})
    for rid in base:
        assert spec[rid][0] == base[rid][0], rid
        assert spec[rid][1] == base[rid][1] == "length"
    sp = eng.speculator
    assert sp.num_accepted["prediction"] > 0 and sp.num_drafted["prompt"] >= 0
    assert spec_steps < base_steps * 0.75, (spec_steps, base_steps)
    last = spec["r0"][3]  # the exact prediction: every token matched, nothing unused
    assert last.num_accepted_prediction_tokens == len(spec["r0"][0])
    assert last.num_rejected_prediction_tokens == 0
    assert last.num_draft_tokens >= last.num_accepted_draft_tokens > 0
    odd = spec["r1"][3]  # (a tiny random model's output repeats itself: counts are loose)
    assert 0 < odd.num_accepted_prediction_tokens <= len(spec["r1"][0])
    assert odd.num_accepted_prediction_tokens + odd.num_rejected_prediction_tokens == \
        len(spec["r1"][0])  # the prediction is as long as the output


def test_greedy_identical_with_the_cpu_kernels_and_prefix_caching_off():
    base, spec, *_ = _greedy_case({"torch_attention": False, "enable_prefix_caching": False})
    for rid in base:
        assert spec[rid][0] == base[rid][0], rid


def test_greedy_identical_int4_keys_with_fill_rows(monkeypatch):
    """int4 keys keep the block being filled at full precision (fill rows): a verify stays in
    one block, and the step after a rollback reads that block's accepted keys from the rows, as
    a plain decode does (logprobs within 1e-6 here; read from the int4 codes instead, they move
    by up to 1.5e-4)."""
    monkeypatch.setenv(FILL_BLOCK_ENV, "1")
    base, spec, _, _, eng = _greedy_case({"kv": "int4-fp8", "graphs": True}, {"logprobs": 1})
    assert eng.scheduler.config.draft_within_block
    for rid in base:
        assert spec[rid][0] == base[rid][0], rid
        assert spec[rid][2] == pytest.approx(base[rid][2], abs=2e-5), rid  # codes: 1.5e-4 off


@pytest.mark.parametrize("params_kw", [
    {"temperature": 0.9, "seed": 7, "top_k": 20, "logprobs": 2},
    {"temperature": 0.0, "repetition_penalty": 1.3, "presence_penalty": 0.4,
     "frequency_penalty": 0.2, "logprobs": 1},
    {"temperature": 1.1, "seed": 3, "min_p": 0.05, "frequency_penalty": 0.5},
])
def test_sampled_penalized_and_logprobs_identical(params_kw):
    base, spec, *_ = _greedy_case({}, params_kw)
    for rid in base:
        assert spec[rid][0] == base[rid][0], rid
        assert spec[rid][2] == pytest.approx(base[rid][2], abs=1e-4), rid


def test_stop_tokens_and_min_tokens_across_accepted_runs():
    engine = _engine(None)
    vocab = engine.runner.model.config.vocab_size
    prompt = _prompts(1, vocab, 4)[0]
    free, _ = _run(engine, {"a": (prompt, SamplingParams(max_tokens=30, ignore_eos=True))})
    toks = free["a"][0]
    k = next(i for i in range(8, len(toks)) if toks[i] not in toks[:i])  # a stop id's first use
    stop = toks[k]
    for min_tokens in (0, k + 2):
        params = SamplingParams(max_tokens=30, ignore_eos=True, stop_token_ids=(stop,),
                                min_tokens=min_tokens)
        want, _ = _run(_engine(None), {"a": (prompt, params)})
        got, _ = _run(_engine(SPEC), {"a": (prompt, params)}, {"a": toks})
        assert got["a"][0] == want["a"][0] and got["a"][1] == want["a"][1] == "stop"
        assert got["a"][3].num_accepted_draft_tokens > 0
    assert len(want["a"][0]) > k + 1  # min_tokens held the stop id back


def test_request_off_and_max_draft_tokens():
    engine = _engine(SPEC)
    vocab = engine.runner.model.config.vocab_size
    prompt = _prompts(1, vocab, 5)[0]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    free, _ = _run(_engine(None), {"a": (prompt, params)})
    pred = free["a"][0]
    assert engine.add_request("off", prompt, params, prediction=pred,
                              speculation_off=True) is None
    assert engine.add_request("two", prompt, params, prediction=pred,
                              max_draft_tokens=2) is None
    seen = {"off": 0, "two": 0}
    while engine.has_unfinished():
        plan_before = engine.scheduler.num_steps
        outs = engine.step()
        assert engine.scheduler.num_steps == plan_before + 1
        for c in engine.last_step.plan.chunks:
            seen[c.request_id] = max(seen[c.request_id], c.num_draft)
        engine.check_integrity()
        for o in outs:
            if o.request_id == "off":
                assert o.num_draft_tokens == 0
    assert seen == {"off": 0, "two": 2}
    assert engine.add_request("bad", prompt, params, prediction=[vocab]) is not None


def test_abort_mid_speculation_leaks_nothing():
    engine = _engine(SPEC, num_blocks=40)
    vocab = engine.runner.model.config.vocab_size
    prompts = _prompts(4, vocab, 6)
    for i, p in enumerate(prompts):
        assert engine.add_request(f"r{i}", p, SamplingParams(max_tokens=60, ignore_eos=True),
                                  prediction=[(t * 7) % vocab for t in p]) is None
    for n in range(12):
        engine.step()
        engine.check_integrity()
        if n == 5:
            engine.abort("r1")
    for rid in list(engine.request_ids):
        engine.abort(rid)
    engine.check_integrity()
    assert engine.scheduler.block_manager.num_used_blocks == 0
    assert not engine.speculator.states


def test_advance_turns_speculate_and_stay_identical():
    engine_kw = {"graphs": True}
    base_engine = _engine(None, **engine_kw)
    vocab = base_engine.runner.model.config.vocab_size
    prompts = _prompts(3, vocab, 8)
    reqs = {f"r{i}": (p, SamplingParams(max_tokens=25, ignore_eos=True))
            for i, p in enumerate(prompts)}
    base, _ = _run(base_engine, reqs, turn="advance")
    preds = {rid: base[rid][0] for rid in reqs}
    eng = _engine(SPEC, **engine_kw)
    eng.async_scheduling = True  # the CUDA loop's order on the CPU: pipelined when no drafts
    spec, _ = _run(eng, reqs, preds, turn="advance")
    assert {r: v[0] for r, v in spec.items()} == {r: v[0] for r, v in base.items()}
    assert eng.speculator.num_accepted["prediction"] > 0


def test_saturation_turns_drafting_off():
    cfg = SpeculationConfig(max_draft_tokens=6, knee_tokens=4)
    engine = _engine(cfg)
    vocab = engine.runner.model.config.vocab_size
    prompts = _prompts(6, vocab, 9)
    reqs = {f"r{i}": (p, SamplingParams(max_tokens=12, ignore_eos=True))
            for i, p in enumerate(prompts)}
    _run(engine, reqs, {rid: [1] * 12 for rid in reqs})
    assert engine.speculator.policy.num_steps_off_by_load > 0


def _chi2_sf(x: float, df: int) -> float:
    """Survival function of the chi-square distribution (df even or odd) by the series."""
    # regularized upper incomplete gamma Q(df/2, x/2) by its continued fraction / series
    a, z = df / 2.0, x / 2.0
    if z < a + 1:  # series for P, Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(500):
            n += 1
            term *= z / n
            total += term
        return 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a))
    b, c, d = z + 1 - a, 1e300, 1.0 / (z + 1 - a)  # Lentz
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        h *= d * c
    return h * math.exp(-z + a * math.log(z) - math.lgamma(a))


def test_sampled_distribution_after_an_accepted_draft_chi_square():
    """Unseeded top-3 sampling at temperature 1, many requests, a prediction [d1, d2, d3]: the
    second token, among the outputs whose first token was d1 (so it was verified against the
    draft d2), must follow the model's p(. | prompt, d1)."""
    engine = _engine(SPEC, max_num_seqs=64, num_blocks=400, enable_prefix_caching=False)
    vocab = engine.runner.model.config.vocab_size
    prompt = _prompts(1, vocab, 11, repetitive=False)[0]
    # the model's conditional distributions, from the engine's own logits (plain steps)
    d1 = sequence_logits(engine, prompt)[-1].argmax().item()
    top1 = sequence_logits(engine, prompt + [d1])[-1].topk(3)
    d2 = top1.indices[1].item()  # draft the second most likely: both outcomes are common
    probs = torch.softmax(top1.values, dim=0).tolist()
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=3, ignore_eos=True)
    n = 1500
    counts = dict.fromkeys(top1.indices.tolist(), 0)
    num_cond = 0
    batch = 60
    drafted = 0
    for start in range(0, n, batch):
        reqs = {f"s{i}": (prompt, params) for i in range(start, min(n, start + batch))}
        out, _ = _run(engine, reqs, {rid: [d1, d2, d2] for rid in reqs})
        for rec in out.values():
            toks = rec[0]
            drafted += rec[3].num_draft_tokens
            if toks[0] == d1:
                num_cond += 1
                counts[toks[1]] += 1
    assert drafted > 0 and num_cond > 300
    expected = [p * num_cond for p in probs]
    chi2 = sum((counts[t] - e) ** 2 / e for t, e in zip(top1.indices.tolist(), expected))
    assert _chi2_sf(chi2, 2) > 1e-3, (counts, expected, chi2)


def test_chi2_sf_matches_known_values():
    assert _chi2_sf(5.991, 2) == pytest.approx(0.05, abs=1e-3)
    assert _chi2_sf(13.816, 2) == pytest.approx(0.001, abs=1e-4)
    assert _chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-3)


@pytest.mark.parametrize("host_kv_gib", [0.0, 0.002])
def test_preemption_and_host_tier_stay_identical(host_kv_gib):
    """A pool too small for every sequence: preemption (recompute, or swaps to the host tier)
    while sequences speculate; outputs equal plain decoding's, every block and host block back."""
    kw = {"num_blocks": 30, "host_kv_gib": host_kv_gib, "max_num_seqs": 6}
    off = _engine(None, **kw)
    vocab = off.runner.model.config.vocab_size
    prompts = _prompts(6, vocab, 12)
    reqs = {f"r{i}": (p, SamplingParams(max_tokens=24, ignore_eos=True))
            for i, p in enumerate(prompts)}
    base, _ = _run(off, reqs)
    on = _engine(SPEC, **kw)
    spec, _ = _run(on, reqs, {rid: base[rid][0] for rid in reqs})
    assert {r: v[0] for r, v in spec.items()} == {r: v[0] for r, v in base.items()}
    assert on.scheduler.num_preemptions > 0 and on.speculator.num_accepted["prediction"] > 0
    if host_kv_gib:
        assert on.scheduler.block_manager.host is not None
        assert not on.scheduler.block_manager.host.swapped_seq_ids()


def test_no_drafts_to_be_had_keeps_the_steps_pipelined():
    """Async scheduling (the CUDA loop's order, on the CPU stand-in): when no sequence has a draft
    (no prediction, prompts without repeats, speculation off per request), reading each step back
    before planning the next would cost the pipelining for nothing: after a read-back that found
    nothing, the next turns stay pipelined (1, 2, 4 .. 16 of them)."""
    eng = _engine(SpeculationConfig(sources=("prediction",)), graphs=True)  # none to be had
    eng.async_scheduling = True
    vocab = eng.runner.model.config.vocab_size
    prompts = _prompts(3, vocab, 13, repetitive=False)
    for i, p in enumerate(prompts):
        assert eng.add_request(f"r{i}", p, SamplingParams(max_tokens=60, ignore_eos=True)) is None
    overlapped = total = 0
    while eng.has_unfinished():
        eng.advance()
        done, nxt = eng.last_step, eng._inflight
        if done is not None and nxt is not None and done.plan.num_decodes:
            total += 1
            overlapped += nxt.start < done.end  # launched before the last one was read back
    eng.settle()
    assert total > 50 and overlapped / total > 0.8, (overlapped, total)


def test_usage_counts_match_the_gateway_and_stop_nothing_past_a_stop():
    """Issue 28's accounting: at the finish the engine's accepted / rejected prediction tokens
    are the gateway's count (`prediction_overlap`: the prediction's tokens that appear, in
    order, in the output, and the rest); the accepted draft tokens count none past a stop token
    (every accepted draft is an output token that no step sampled)."""
    from scheduler.prediction_usage import prediction_overlap

    engine = _engine(None)
    vocab = engine.runner.model.config.vocab_size
    prompt = _prompts(1, vocab, 4)[0]
    free, _ = _run(engine, {"a": (prompt, SamplingParams(max_tokens=40, ignore_eos=True))})
    toks = free["a"][0]
    k = next(i for i in range(8, len(toks)) if toks[i] not in toks[:i])
    params = SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=(toks[k],),
                            logprobs=1)
    # predictions: the free output (it runs on past the stop: the last verify's drafts all
    # match, the stop is the first of them), and the same with tokens 10..19 edited
    edited = [t if not 10 <= j < 20 else (t + 1) % vocab for j, t in enumerate(toks)]
    for pred in (toks, edited):
        eng = _engine(SPEC)
        assert eng.add_request("a", prompt, params, prediction=pred) is None
        got, lps, num_sampled, last = [], [], 0, None
        while eng.has_unfinished():
            for o in eng.step():
                got += o.new_token_ids
                lps += o.logprobs
                num_sampled += bool(o.new_token_ids)  # one sampled token a step, the rest drafts
                last = o
        # cut at the stop token as decoding is: tokens, logprobs, the completion count, and
        # the rejected tokens' KV given back
        assert got == toks[:k + 1] and last.finish_reason == "stop"
        assert len(lps) == last.num_completion_tokens == len(got)
        eng.check_integrity()
        assert eng.scheduler.block_manager.num_used_blocks == 0
        num_accepted = sum(eng.speculator.num_accepted.values())
        assert num_accepted == last.num_accepted_draft_tokens == len(got) - num_sampled > 0
        accepted = prediction_overlap(pred, got)
        assert (last.num_accepted_prediction_tokens, last.num_rejected_prediction_tokens) == \
            (accepted, len(pred) - accepted)



def test_back_off_ends_when_the_prediction_resynchronises(tmp_path):
    """Async scheduling: in an edited stretch the prediction has nothing to draft and the
    engine backs off (pipelined turns without asking); once the output is back on the
    prediction it asks again at once (scheduler.speculation.DraftBackoff), not after the
    back-off ran out: fewer turns (41 -> 30 here), the same greedy output. Dummy-cycle weights:
    an output that does not repeat itself (the tiny model's re-synchronises at once)."""
    from tests.backend_helpers import make_checkpoint

    kw = {"graphs": True, "load_format": "dummy-cycle",
          "model": str(make_checkpoint(tmp_path, "gqa7_sharded"))}
    base_engine = _engine(None, **kw)
    vocab = base_engine.runner.model.config.vocab_size
    prompt = _prompts(1, vocab, 14, repetitive=False)[0]
    params = SamplingParams(max_tokens=90, ignore_eos=True)
    base, _ = _run(base_engine, {"a": (prompt, params)}, turn="advance")
    toks = base["a"][0]
    assert len(set(toks)) == len(toks)  # (the cycle: nothing to re-align on but the prediction)
    pred = [t if not 20 <= j < 34 else (t + 7) % vocab for j, t in enumerate(toks)]
    turns = {}
    for reset in (False, True):
        eng = _engine(SpeculationConfig(sources=("prediction",), max_draft_tokens=6,
                                        knee_tokens=64, min_draft_prob=0.01), **kw)
        eng.async_scheduling = True
        eng.speculator.backoff.reset_on_align = reset
        out, turns[reset] = _run(eng, {"a": (prompt, params)}, {"a": pred}, turn="advance")
        assert out["a"][0] == toks
    assert turns[True] < turns[False], turns


def test_prompt_lookup_indexes_catch_up_after_the_launch_under_async_scheduling():
    """Async scheduling (the CUDA loop's order on the CPU stand-in): a started prompt-lookup
    index that is behind its tokens is caught up right after a launch, while the device would
    run the step (`Speculator.index_ahead`), so the next drafting step's planning indexes
    nothing; the output is still that of decoding without speculation. The synchronous loop
    (the CPU engine, no device shadow) does not: its planning keeps the catch-up."""
    cfg = SpeculationConfig(sources=("prompt",), lookup_index_tokens_per_step=8)
    base_engine = _engine(None, graphs=True)
    vocab = base_engine.runner.model.config.vocab_size
    prompts = _prompts(2, vocab, 21)
    reqs = {f"r{i}": (p, SamplingParams(max_tokens=20, ignore_eos=True))
            for i, p in enumerate(prompts)}
    base, _ = _run(base_engine, reqs, turn="advance")
    for async_scheduling in (True, False):
        eng = _engine(cfg, graphs=True)
        eng.async_scheduling = async_scheduling
        ahead: list[int] = []

        def counted(real=eng.speculator.index_ahead, ahead=ahead):
            ahead.append(real())
            return ahead[-1]

        eng.speculator.index_ahead = counted
        out, _ = _run(eng, reqs, turn="advance")
        assert {r: v[0] for r, v in out.items()} == {r: v[0] for r, v in base.items()}
        if async_scheduling:
            assert sum(ahead) > 0  # the shadow indexed tokens the planning would have
        else:
            assert ahead == []


def test_each_step_reports_its_host_phases_and_the_step_log_writes_them(tmp_path):
    """A drafting step has no device timing events; the step log tells its host's part from
    the rest by phases (`InFlightStep.host_phases`): planning, the launch's host work, launch
    to read-back, handling after the read-back, which add up to the step's span."""
    import json

    from backend.server.step_log import StepLog

    eng = _engine(SPEC, graphs=True)
    vocab = eng.runner.model.config.vocab_size
    prompt = _prompts(1, vocab, 23)[0]
    assert eng.add_request("r", prompt, SamplingParams(max_tokens=12, ignore_eos=True),
                           prediction=list(prompt[:12])) is None
    log = StepLog(tmp_path / "steps.jsonl")
    drafted = 0
    while eng.has_unfinished():
        eng.step()
        st = eng.last_step
        phases = st.host_phases()
        assert phases is not None and all(x >= 0 for x in phases)
        assert sum(phases) == pytest.approx(st.end - st.start, abs=1e-9)
        drafted += any(getattr(c, "num_draft", 0) for c in st.plan.chunks)
        log.record(st.start_wall, st.end - st.start, st.plan, host_phases=phases)
    assert drafted > 0
    log.write()
    rows = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert all(len(r["host_ms"]) == 4 and sum(r["host_ms"]) <= r["ms"] + 1e-3 for r in rows)


def test_the_phase_benchmark_times_the_drafting_steps_planning(capsys):
    """`python -m bench.engine.spec_phases` (BENCHMARKS' CPU stand-in for the H200's drafting
    steps) serves its predictions and reports the drafting phase of every step it planned."""
    from bench.engine.spec_phases import main

    assert main(["--requests", "2", "--prompt-tokens", "40", "--max-tokens", "10"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert int(rows["_drafts"][0]) >= 1 and "index_ahead" in rows and "runner.launch" in rows
