"""The event loop against closed forms, k-step advance equivalence, determinism, batching."""
import numpy as np
import pytest

from scheduler.batcher import BatcherConfig
from scheduler.placement import PlacementConfig
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost, RooflineCost
from sims.event_loop import EngineConfig, simulate
from sims.hardware import get_gpu
from sims.model_shape import load_model_shape
from sims.report import summarize
from sims.workload import LengthSpec, WorkloadConfig, generate


def _workload(n, rate, prompt=16, output=1, seed=0, **kw):
    return generate(WorkloadConfig(num_requests=n, rate=rate, input_len=LengthSpec("fixed", prompt),
                                   output_len=LengthSpec.parse(output), seed=seed, **kw))


def test_md1_waits_follow_lindley_and_the_closed_form():
    """One backend serving one request per step of constant S (max_num_seqs=1, one output token,
    so prefill = whole service), Poisson arrivals, idle flush: an M/D/1 queue."""
    S, rho, n = 0.01, 0.5, 50_000
    w = _workload(n, rho / S)
    r = simulate(w, ConstantCost(S), SimSchedulerConfig(max_num_seqs=1), EngineConfig())
    wait = r.first_token_time - w.arrival_time - S
    # exact sample path: Lindley's recursion W[k+1] = max(0, W[k] + S - gap[k])
    gaps = np.diff(w.arrival_time)
    lindley = np.zeros(n)
    for k in range(n - 1):
        lindley[k + 1] = max(0.0, lindley[k] + S - gaps[k])
    np.testing.assert_allclose(wait, lindley, atol=1e-9)
    assert wait.mean() == pytest.approx(rho * S / (2 * (1 - rho)), rel=0.02)
    assert np.array_equal(r.finish_time, r.first_token_time)


def test_saturated_throughput_equals_cost_model_capacity():
    # constant steps, 8 sequence slots, everything arrives at once: 8 tokens per step
    S, M = 0.02, 8
    w = _workload(400, 1e7, output=64)
    r = simulate(w, ConstantCost(S), SimSchedulerConfig(max_num_seqs=M), EngineConfig())
    rep = summarize(r)
    assert rep["completed"] == 400
    assert rep["output_throughput"] == pytest.approx(M / S, rel=0.01)
    # roofline, prefill only: 4 prompts of 512 fill the 2048-token budget of every step
    cost = RooflineCost(load_model_shape("deepseek-coder-1.3b"), get_gpu("h200"))
    w = _workload(2000, 1e7, prompt=512)
    rep = summarize(simulate(w, cost, SimSchedulerConfig(), EngineConfig()))
    assert rep["request_throughput"] == pytest.approx(4 / cost.step_time(0, 2048, 2048), rel=0.01)


@pytest.mark.parametrize("backends,rate", [(1, 20.0), (2, 300.0)])
def test_k_step_advance_gives_the_same_metrics_as_single_steps(backends, rate):
    cost = RooflineCost(load_model_shape("deepseek-coder-1.3b"), get_gpu("h100"))
    w = generate(WorkloadConfig(num_requests=300, rate=rate, input_len=LengthSpec.parse("uniform:16:300"),
                                output_len=LengthSpec.parse("uniform:1:100"), seed=5))
    sched = SimSchedulerConfig(max_num_seqs=32)
    fast = simulate(w, cost, sched, EngineConfig(num_backends=backends))
    slow = simulate(w, cost, sched, EngineConfig(num_backends=backends, max_stretch_steps=1))
    for name in ("first_token_time", "finish_time", "dispatch_time"):
        np.testing.assert_allclose(getattr(fast, name), getattr(slow, name), rtol=1e-9, atol=1e-12)
    a, b = summarize(fast), summarize(slow)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        for stat in ("mean", "p50", "p90", "p99"):
            assert a[key][stat] == pytest.approx(b[key][stat], rel=1e-9)
    assert a["steps"]["num_steps"] == b["steps"]["num_steps"]
    assert a["preemptions"] == b["preemptions"]
    assert fast.events < slow.events / (5 if rate < 100 else 1.2)  # stretches really were taken


def test_k_step_advance_equivalence_under_preemption():
    # a pool too small for the load forces preemptions; stretches must still match single steps
    w = generate(WorkloadConfig(num_requests=120, rate=500.0, input_len=LengthSpec.parse("uniform:32:128"),
                                output_len=LengthSpec.parse("uniform:20:80"), seed=1))
    cost = ConstantCost(0.005, num_blocks=60)
    sched = SimSchedulerConfig(max_num_seqs=16, max_model_len=512)
    fast = simulate(w, cost, sched, EngineConfig())
    slow = simulate(w, cost, sched, EngineConfig(max_stretch_steps=1))
    assert summarize(slow)["preemptions"] > 0
    np.testing.assert_allclose(fast.finish_time, slow.finish_time, rtol=1e-9)
    np.testing.assert_allclose(fast.first_token_time, slow.first_token_time, rtol=1e-9)


def test_deterministic_by_seed():
    cost = RooflineCost(load_model_shape("deepseek-coder-1.3b"), get_gpu("h200"))
    wl = {"num_requests": 400, "rate": 200.0, "arrival": "gamma", "cv": 2.0,
              "input_len": LengthSpec.parse("lognormal:200:0.5"), "output_len": LengthSpec.parse("uniform:1:64")}
    runs = [summarize(simulate(generate(WorkloadConfig(seed=s, **wl)), cost, SimSchedulerConfig(),
                               EngineConfig(num_backends=2))) for s in (7, 7, 8)]
    for rep in runs:
        del rep["sim"]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_window_batches_under_load_and_never_holds_past_min_latency():
    cost = RooflineCost(load_model_shape("deepseek-coder-1.3b"), get_gpu("h200"))
    w = _workload(3000, 20000.0, prompt=64, output=8)
    batcher = BatcherConfig(min_latency_ms=5.0, idle_flush=False)
    r = simulate(w, cost, SimSchedulerConfig(batcher=batcher), EngineConfig(num_backends=2))
    rep = summarize(r)
    assert rep["batch_size"]["mean"] > 50
    assert rep["queue_wait_ms"]["p99"] <= 5.0 + 1e-6
    # no window: every request leaves alone, at once
    r0 = simulate(w, cost, SimSchedulerConfig(batcher=BatcherConfig(min_latency_ms=0.0)),
                  EngineConfig(num_backends=2))
    assert summarize(r0)["queue_wait_ms"]["p99"] == 0.0


def test_shared_prefix_hits_the_prefix_cache():
    cost = RooflineCost(load_model_shape("deepseek-coder-1.3b"), get_gpu("h200"))
    w = generate(WorkloadConfig(num_requests=300, rate=50.0, input_len=LengthSpec("fixed", 300),
                                output_len=LengthSpec("fixed", 8), shared_prefix_fraction=0.5,
                                shared_prefix_len=256, seed=0))
    rep = summarize(simulate(w, cost, SimSchedulerConfig(), EngineConfig()))
    # ~half the requests find 256 of 300 tokens cached (after the first of the group)
    assert 0.3 < rep["kv"]["prefix_hit_rate"] < 0.5


def test_auto_prefix_caching_is_on_only_with_shared_prefixes_and_changes_nothing_else():
    cost = RooflineCost(load_model_shape("deepseek-coder-1.3b"), get_gpu("h200"))
    auto = SimSchedulerConfig(enable_prefix_caching=None)
    shared = generate(WorkloadConfig(num_requests=300, rate=50.0, input_len=LengthSpec("fixed", 300),
                                     output_len=LengthSpec("fixed", 8), shared_prefix_fraction=0.5,
                                     shared_prefix_len=256, seed=0))
    assert auto.prefix_caching_for(shared)
    assert 0.3 < summarize(simulate(shared, cost, auto, EngineConfig()))["kv"]["prefix_hit_rate"] < 0.5
    # no shared prefixes (and no preemption): the cache never hits, so off gives the same run
    w = _workload(400, 300.0, prompt=200, output="uniform:1:60", seed=3)
    assert not auto.prefix_caching_for(w)
    # least-tokens placement: with the prefix policy, hashed prompts that no backend holds take
    # turns over the backends (scheduler.placement), which is placement, not caching
    two = EngineConfig(num_backends=2, placement=PlacementConfig(policy="least-tokens"))
    on = simulate(w, cost, SimSchedulerConfig(enable_prefix_caching=True), two)
    off = simulate(w, cost, auto, two)
    for name in ("dispatch_time", "first_token_time", "finish_time", "step_time", "step_decode"):
        np.testing.assert_array_equal(getattr(on, name), getattr(off, name))
    assert [b["num_preemptions"] for b in on.backend_stats] == [0, 0]
    assert [b["num_cached_blocks"] for b in off.backend_stats] == [0, 0]


@pytest.mark.parametrize("backends,rate,output", [(1, 20.0, "40"), (2, 300.0, "uniform:1:100"),
                                                  (3, 80.0, "64")])
def test_stretches_past_finishes_give_the_same_metrics_as_single_steps(backends, rate, output):
    cost = RooflineCost(load_model_shape("deepseek-coder-1.3b"), get_gpu("h100"))
    w = generate(WorkloadConfig(num_requests=300, rate=rate, input_len=LengthSpec.parse("uniform:16:300"),
                                output_len=LengthSpec.parse(output), seed=3))
    sched = SimSchedulerConfig(max_num_seqs=32)
    past = simulate(w, cost, sched, EngineConfig(num_backends=backends, max_stretch_finishes=8))
    stop = simulate(w, cost, sched, EngineConfig(num_backends=backends, max_stretch_finishes=0))
    slow = simulate(w, cost, sched, EngineConfig(num_backends=backends, max_stretch_steps=1))
    for name in ("first_token_time", "finish_time", "dispatch_time"):
        np.testing.assert_allclose(getattr(past, name), getattr(slow, name), rtol=1e-9, atol=1e-12)
    a, b = summarize(past), summarize(slow)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        for stat in ("mean", "p50", "p99"):
            assert a[key][stat] == pytest.approx(b[key][stat], rel=1e-9)
    assert a["steps"]["decode_batch_histogram"] == b["steps"]["decode_batch_histogram"]
    assert a["steps"]["num_steps"] == b["steps"]["num_steps"]
    assert a["steps"]["mean_step_ms"] == pytest.approx(b["steps"]["mean_step_ms"], rel=1e-9)
    np.testing.assert_allclose(np.sort(past.step_time), np.sort(slow.step_time), rtol=1e-9)
    assert past.events < stop.events  # finishes really were passed


class _ChunkRecordingCost(ConstantCost):
    """A constant step time that records what the engine hands to a chunk-aware cost model."""

    accepts_prefill_chunks = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def step_time(self, num_decode_seqs, num_prefill_tokens, num_context_tokens, prefill_chunks=None):
        if prefill_chunks is not None:
            self.calls.append((num_prefill_tokens, [len(c.token_ids) for c in prefill_chunks]))
        return super().step_time(num_decode_seqs, num_prefill_tokens, num_context_tokens)


def test_chunk_aware_cost_models_get_each_packed_prefill():
    """A measured profile charges packed prompts one by one; the engine must hand it the chunks
    of every step that prefills, and their lengths must add up to the step's prefill tokens."""
    cost = _ChunkRecordingCost(0.002)
    simulate(_workload(200, 2000.0, prompt=24, output=4), cost, SimSchedulerConfig(), EngineConfig())
    assert cost.calls, "no step handed its prefill chunks to the cost model"
    assert all(total == sum(lens) for total, lens in cost.calls)
    assert any(len(lens) > 1 for _, lens in cost.calls)  # packed prompts really occur
