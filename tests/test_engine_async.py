"""Async scheduling (backend.engine.continuous): step k+1 planned and launched while step k runs, its
decodes fed from step k's sampled ids on the device, placeholder tokens set right once read
back. Greedy outputs must equal the synchronous loop's."""
from __future__ import annotations

import pytest
import torch

from backend.engine.assemble import BackendConfig, create_engine
from backend.kernels.reference.attention import TorchAttention
from backend.runner.cuda_graphs import StepGraphs
from backend.runner.sampler import SamplingParams
from scheduler.step_scheduler import SchedulerConfig, StepResult, StepScheduler


def test_set_token_overwrites_a_placeholder_and_ignores_unknown_requests():
    s = StepScheduler(SchedulerConfig(max_model_len=64, num_blocks=16, max_num_seqs=4,
                                      max_num_batched_tokens=64, block_size=4))
    assert s.add_request("a", [1, 2, 3], 4, 0.0) is None
    plan = s.schedule()
    s.update(plan, StepResult(sampled={"a": 0}))  # placeholder for the first output token
    assert s.requests["a"].token_ids == [1, 2, 3, 0]
    assert s.set_token("a", 3, 42)
    assert s.requests["a"].token_ids == [1, 2, 3, 42]
    assert not s.set_token("a", 9, 1)  # not sampled yet
    assert not s.set_token("gone", 0, 1)
    s.check_integrity()


# ---- the engine: async turns give the synchronous loop's tokens ---------------------------------


def _engine(graphs: bool, num_blocks: int = 22):
    engine, _ = create_engine(BackendConfig(model="tiny", num_blocks=num_blocks, block_size=4,
                                            max_num_seqs=6, max_num_batched_tokens=40,
                                            max_model_len=256))
    # torch attention: the same op order on every path, so greedy ids compare exactly
    engine.runner.model.attn = TorchAttention(engine.runner.model.config.head_dim ** -0.5)
    if graphs:  # the CPU stand-in of the CUDA graphs (decode buckets, mixed token buckets)
        engine.runner.graphs = StepGraphs(engine.runner, (1, 2, 4, 8), use_cuda_graphs=False,
                                          token_buckets=(8, 16, 32))
    return engine


def _requests(vocab: int, stops: dict[str, int] | None = None, sampled: bool = False,
              sampled_index: int = 2):
    g = torch.Generator().manual_seed(3)
    reqs = {}
    for i, n in enumerate((5, 17, 3, 30, 9, 12, 7, 4)):
        prompt = torch.randint(0, vocab, (n,), generator=g).tolist()
        stop = (stops or {}).get(f"r{i}")
        params = SamplingParams(max_tokens=6 + 3 * i, ignore_eos=True,
                                stop_token_ids=(stop,) if stop is not None else (),
                                temperature=0.7 if sampled and i == sampled_index else 0.0,
                                seed=i)
        reqs[f"r{i}"] = (prompt, params)
    return reqs


def _run(engine, reqs, turn, late: int = 3):
    """Serve `reqs` (the last `late` of them added a few turns in); id -> (tokens, reason).
    `turn` is engine.step (synchronous) or engine.advance (async turns)."""
    out = {rid: [[], None] for rid in reqs}
    items = list(reqs.items())
    for rid, (prompt, params) in items[:-late]:
        assert engine.add_request(rid, prompt, params) is None
    turns = 0
    while engine.has_unfinished() or turns < 4:
        if turns == 3:
            for rid, (prompt, params) in items[-late:]:
                assert engine.add_request(rid, prompt, params) is None
        for o in turn():
            assert out[o.request_id][1] is None, f"{o.request_id} got tokens after finishing"
            out[o.request_id][0].extend(o.new_token_ids)
            out[o.request_id][1] = o.finish_reason
        turns += 1
        if not engine.has_unfinished():
            engine.check_integrity()
    return {rid: (tuple(t), r) for rid, (t, r) in out.items()}


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-standin"])
def test_async_turns_equal_the_synchronous_loop(graphs):
    """Greedy tokens and finish reasons identical to engine.step(): length finishes, stop tokens
    hit mid-stream (their sequence was already planned into the next step), preemption in a
    small pool, requests arriving while steps are in flight, mixed prefill+decode steps; and
    the async path really ran (steps launched before the previous read-back, decodes fed from
    the device rows)."""
    ref_engine = _engine(graphs)
    vocab = ref_engine.runner.model.config.vocab_size
    plain = _run(ref_engine, _requests(vocab), ref_engine.step)
    assert ref_engine.scheduler.num_preemptions >= 1
    # stop tokens that greedy decoding really reaches, at different points of the streams
    stops = {rid: toks[k] for (rid, (toks, _)), k in zip(plain.items(), (2, 0, 4, 1, 3, 5, 1, 2))}
    ref_engine = _engine(graphs)
    with_stops = _run(ref_engine, _requests(vocab, stops), ref_engine.step)
    assert sum(r == "stop" for _, r in with_stops.values()) >= 6

    for reqs, ref, preempts in ((_requests(vocab), plain, True),
                                (_requests(vocab, stops), with_stops, False)):
        engine = _engine(graphs)
        engine.async_scheduling = True
        launches = []
        real_launch = engine.runner.launch

        def spy(chunks, sampling=None, keep_logits=False, gpu_src=None, real_launch=real_launch,
                launches=launches):
            launches.append(sum(1 for c in chunks if gpu_src and c.request_id in gpu_src))
            return real_launch(chunks, sampling, keep_logits, gpu_src)

        engine.runner.launch = spy
        assert _run(engine, reqs, engine.advance) == ref
        assert engine.scheduler.num_preemptions >= 1 or not preempts
        assert sum(1 for n in launches if n) >= len(launches) // 2, launches  # mostly device-fed
        engine.check_integrity()
        assert engine.scheduler.block_manager.num_used_blocks == 0


def test_async_turns_with_a_sampled_request_fall_back_and_still_agree():
    """A seeded non-greedy request: the turns after its steps read back before planning (its
    token is the sampler's, not the in-step argmax); every token still equals the sync loop's."""
    ref_engine = _engine(True)
    vocab = ref_engine.runner.model.config.vocab_size
    ref = _run(ref_engine, _requests(vocab, sampled=True), ref_engine.step)
    engine = _engine(True)
    engine.async_scheduling = True
    assert _run(engine, _requests(vocab, sampled=True), engine.advance) == ref


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-standin"])
def test_stop_read_back_while_a_synchronous_step_is_in_flight(graphs):
    """A's stop token (its 3rd token, step 3) is read back by the turn that launches step 4, which
    carries a sampled request's first sample and so is synchronous: A is finished then, and step
    4's token for A is dropped when step 4 is read back (A has no state any more)."""
    greedy = SamplingParams(max_tokens=8, ignore_eos=True)
    prompt_a = [150, 211, 243, 107, 148, 70, 115, 126]  # greedy: a 3rd token unlike the first two
    ref = _engine(graphs, num_blocks=64)
    for rid, prompt in (("a", prompt_a), ("b", [8, 9])):
        assert ref.add_request(rid, prompt, greedy) is None
    want: dict[str, list[int]] = {"a": [], "b": []}
    while ref.has_unfinished():
        for o in ref.step():
            want[o.request_id] += o.new_token_ids
    stop = want["a"][2]
    assert stop not in want["a"][:2]

    engine = _engine(graphs, num_blocks=64)
    engine.async_scheduling = True
    assert engine.add_request("a", prompt_a, SamplingParams(
        max_tokens=8, ignore_eos=True, stop_token_ids=(stop,))) is None
    assert engine.add_request("b", [8, 9], greedy) is None
    got: dict[str, list[int]] = {}
    reasons = {}

    def turn():
        for o in engine.advance():
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
            reasons[o.request_id] = o.finish_reason

    for _ in range(3):  # steps 1-3 launched, 1-2 read back: every step so far pipelined
        turn()
    assert engine._inflight.pipelined and reasons.get("a") is None
    assert engine.add_request("c", [1, 2, 3], SamplingParams(
        max_tokens=3, temperature=0.7, seed=1, ignore_eos=True)) is None
    turn()  # launches step 4 (c's sampled prefill: synchronous), reads back step 3: a stops
    assert reasons.get("a") == "stop" and not engine._inflight.pipelined
    while engine.has_unfinished():
        turn()  # reads back step 4: its token for a is dropped
    assert got["a"] == want["a"][:3] and got["b"] == want["b"] and len(got["c"]) == 3
    engine.check_integrity()
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_abort_under_async_turns_lands_at_once_and_frees_every_block():
    engine = _engine(True, num_blocks=64)
    engine.async_scheduling = True
    bm = engine.scheduler.block_manager
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    for rid, prompt in (("a", [5, 6, 7]), ("b", [8, 9]), ("c", [1, 2, 3, 4, 5])):
        assert engine.add_request(rid, prompt, params) is None
    engine.advance()
    engine.advance()
    engine.advance()  # a step launched before the last read-back is in flight now
    assert engine._inflight is not None and engine._inflight.pipelined
    rec = engine.abort("a")
    assert rec is not None and rec.finish_reason == "abort" and rec.num_completion_tokens == 2
    got = {}
    while engine.has_unfinished():
        for o in engine.advance():
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert "a" not in got  # its in-flight token was dropped
    assert len(got["b"]) == 10 and len(got["c"]) == 10
    engine.check_integrity()
    assert bm.num_used_blocks == 0


@pytest.mark.gpu
@pytest.mark.parametrize("stops", [False, True], ids=["lengths", "stop-tokens"])
def test_async_turns_equal_the_synchronous_loop_on_cuda(stops):
    """The CUDA default (Triton kernels, captured decode and mixed graphs, device-side inputs
    from the previous replay): async turns give the synchronous loop's greedy tokens. fp32, so
    that a stop-token run (whose async plans carry a dead row for a step) cannot flip a near-tie
    through a different batch shape."""
    from backend.runner.serving import configure_serving

    def engine_():
        engine, _ = create_engine(BackendConfig(model="tiny", device="cuda", dtype="float32",
                                                num_blocks=40, block_size=16, max_num_seqs=6,
                                                max_num_batched_tokens=64, max_model_len=256))
        configure_serving(engine.runner, buckets=(1, 2, 4, 8), token_buckets=(16, 32, 64))
        return engine

    ref_engine = engine_()
    vocab = ref_engine.runner.model.config.vocab_size
    ref = _run(ref_engine, _requests(vocab), ref_engine.step)
    if stops:
        stops_ = {rid: t[k] for (rid, (t, _)), k in zip(ref.items(), (2, 0, 4, 1, 3, 5, 1, 2))}
        ref_engine = engine_()
        ref = _run(ref_engine, _requests(vocab, stops_), ref_engine.step)
    engine = engine_()
    assert engine.async_scheduling  # the CUDA default
    out = _run(engine, _requests(vocab, stops_ if stops else None), engine.advance)
    assert out == ref
    engine.check_integrity()
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_launch_deadline_for_decode_and_prefill_graph_steps():
    """The worker waits for messages until `launch_deadline()`: known for a pipelined step that
    replays a graph (decode-only or mixed: prefill-bearing steps too) once that graph's device
    time is known, from a step that ran or from its capture; None without async turns and when
    nothing is left to plan."""
    import time

    engine = _engine(True, num_blocks=64)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    for rid, prompt in (("a", [5, 6, 7]), ("b", [8, 9])):
        assert engine.add_request(rid, prompt, params) is None
    engine.advance()  # the prefill step is in flight, synchronous order
    assert engine.launch_deadline() is None
    engine.async_scheduling = True
    seen = []
    while engine.has_unfinished():
        engine.advance()
        seen.append(engine.launch_deadline())
    known = [d for d in seen if d is not None]
    assert known and all(d < time.perf_counter() for d in known)  # the CPU: nothing to wait for
    assert seen[-1] is None  # nothing in flight at the end

    # a prefill-bearing step: its mixed graph's time from a step that ran, else from capture
    engine = _engine(True, num_blocks=64)
    engine.async_scheduling = True
    assert engine.add_request("c", [1, 2, 3, 4, 5], params) is None
    engine.advance()
    step = engine._inflight
    assert step.pipelined and step.plan.chunks[-1].is_prefill
    captured = step.launched.graph_launch.captured
    assert engine.launch_deadline() is None  # bucket 8 never timed, no capture time (CPU)
    captured.device_s = 5.0  # as CUDA measures it at capture
    assert engine.launch_deadline() == pytest.approx(step.start + 5.0 - 2 * engine._launch_s - 0.001)
    assert engine.add_request("d", [6, 7, 8, 9, 10, 11], params) is None
    engine.advance()  # launches c's decode with d's prefill (bucket 8), reads back c's prefill
    nxt = engine._inflight
    assert nxt.launched.graph_launch.captured is captured
    assert {ch.request_id for ch in nxt.plan.chunks} == {"c", "d"}
    # the step read back was timed (the CPU: from its launch to its read-back, which took in
    # the next step's forward pass); a shorter time than the estimate replaces it at once
    measured = step.end - step.launched_at
    assert measured < 5.0 and engine._device_s[id(captured)] == measured
    assert engine.launch_deadline() == pytest.approx(
        max(nxt.start, engine._last_end) + measured - 2 * engine._launch_s - 0.001)
    while engine.has_unfinished():
        engine.advance()
    engine.check_integrity()


def test_worker_holds_the_next_step_for_arrivals_during_a_prefill_step(tmp_path, monkeypatch):
    """Issue 11: with async scheduling the step after a prefill-bearing step used to be planned
    as soon as that step launched, so a request arriving while it ran (a 512-token prefill:
    ~70 ms on the H200) waited a whole extra step for its first token. The worker now waits
    for messages until the prefill step's launch deadline too (here its graph's capture time,
    2 s): a request sent while the first one's prefill step runs is prefilled in the very next
    step."""
    import threading

    from backend.engine.continuous import Engine
    from backend.server.step_log import StepLog
    from backend.server.worker import Worker
    from tests.backend_helpers import DealerClient

    monkeypatch.setattr(Engine, "overlaps_device", property(lambda self: True))  # the CUDA loop
    engine, loaded = create_engine(BackendConfig(model="tiny", num_blocks=64, block_size=4,
                                                 max_num_seqs=6, max_num_batched_tokens=40,
                                                 max_model_len=256))
    engine.runner.graphs = StepGraphs(engine.runner, (1, 2, 4, 8), use_cuda_graphs=False,
                                      token_buckets=(8, 16, 32))
    engine.runner.graphs.capture_all()
    for captured in engine.runner.graphs.mixed_graphs.values():
        captured.device_s = 2.0  # what CUDA would have timed at capture
    engine.async_scheduling = True
    log = StepLog(tmp_path / "steps.jsonl")
    worker = Worker(engine, loaded, f"ipc://{tmp_path}/deadline.sock", step_log=log)
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    c = DealerClient(worker.endpoint)
    try:
        c.hello()
        c.batch({"a": [5, 6, 7, 8, 9]}, max_tokens=3, ignore_eos=True, temperature=0.0)
        waited = 0
        while engine._inflight is None and waited < 2000:  # a's prefill step launched
            threading.Event().wait(0.005)
            waited += 1
        c.batch({"b": [10, 11, 12, 13, 14, 15]}, max_tokens=3, ignore_eos=True, temperature=0.0)
        tokens, _, _ = c.collect(["a", "b"])
        assert all(len(t) == 3 for t in tokens.values()), tokens
    finally:
        worker._stopping = True
        thread.join(10)
        c.close()
        worker.close()
    engine.check_integrity()
    prefilled = [[rid for rid, _, _ in row[4]] for row in log.rows]
    assert prefilled[0] == ["a"] and prefilled[1] == ["b"], prefilled
    assert log.rows[1][3] == 1  # and a's first decode rode in that step
