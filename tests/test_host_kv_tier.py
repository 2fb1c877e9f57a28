"""The host KV tier end to end on the CPU (tiny preset): swapped-out sequences and prefix blocks
evicted to host memory come back with the K/V the model computed, and nothing leaks."""
import logging
from types import SimpleNamespace

import pytest
import torch

from backend.engine.assemble import BackendConfig, create_engine
from backend.runner.sampler import SamplingParams

GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)
SMALL = {"model": "tiny", "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 128}


def prompts(lens, seed=0, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def serve(engine, reqs, params=GREEDY, abort_after=None):
    """Serve `reqs` together, integrity checked every step; id -> generated tokens. Requests in
    `abort_after` ({id: step}) are aborted at that step."""
    for rid, prompt in reqs.items():
        assert engine.add_request(rid, prompt, params) is None
    out = {rid: [] for rid in reqs}
    step = 0
    while engine.has_unfinished():
        for rid, at in (abort_after or {}).items():
            if at == step:
                engine.abort(rid)
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
        engine.check_integrity()
        step += 1
        assert step < 5000
    return out


@pytest.fixture(scope="module")
def reference():
    """Greedy tokens with a pool large enough that nothing is preempted or evicted."""
    engine, _ = create_engine(BackendConfig(num_blocks=256, **SMALL))
    reqs = {f"r{i}": p for i, p in enumerate(prompts([40, 52, 33, 61, 45, 38]))}
    out = serve(engine, reqs)
    assert engine.scheduler.num_preemptions == 0
    return reqs, out


def test_swapped_sequences_produce_the_greedy_tokens_of_unpreempted_ones(reference, caplog):
    reqs, want = reference
    engine, _ = create_engine(BackendConfig(num_blocks=40, host_kv_gib=0.002, **SMALL))
    caplog.set_level(logging.INFO, logger="tidegate.scheduler")
    out = serve(engine, reqs)
    sched = engine.scheduler
    assert sched.num_swap_preemptions > 0, "the small pool should have swapped"
    choices = [r.getMessage() for r in caplog.records if r.name == "tidegate.scheduler"]
    assert sum(": swap " in m for m in choices) == sched.num_swap_preemptions  # each one logged
    assert engine.scheduler.block_manager.num_host_hit_tokens > 0, "swapped blocks came back"
    assert out == want
    bm = sched.block_manager
    assert bm.num_used_blocks == 0 and bm.host.num_pinned_blocks == 0
    assert engine.host_kv.num_copies > 0


def test_recompute_rule_still_gives_the_same_tokens(reference):
    """When the measured rule says recompute (copies priced out), the tier only keeps
    evicted prefixes; tokens are unchanged."""
    reqs, want = reference
    engine, _ = create_engine(BackendConfig(num_blocks=40, host_kv_gib=0.002, **SMALL))
    cost = engine.scheduler.swap_cost
    engine.scheduler.swap_cost = type(cost)(cost.block_bytes, 1e-3, 1e-6)  # 1 kB/s, 1 us
    engine._measure_prefill = lambda plan, seconds: None  # keep the priced-out rule
    out = serve(engine, reqs)
    assert engine.scheduler.num_preemptions > 0 and engine.scheduler.num_swap_preemptions == 0
    assert out == want


def test_prefix_evicted_to_host_hits_on_return():
    shared = prompts([32], seed=3)[0]
    first = {"a": shared + [1, 2, 3]}
    flood = {f"f{i}": p for i, p in enumerate(prompts([60, 60, 60], seed=4))}
    again = {"b": shared + [7, 8, 9, 10, 11]}
    with_tier, _ = create_engine(BackendConfig(num_blocks=40, host_kv_gib=0.002, **SMALL))
    plain, _ = create_engine(BackendConfig(num_blocks=40, **SMALL))
    outs, hits = [], []
    for engine in (with_tier, plain):
        bm = engine.scheduler.block_manager
        for reqs in (first, flood):  # the flood evicts the shared prefix from the GPU pool
            outs.append(serve(engine, reqs))
        before, host_before = bm.num_hit_tokens, bm.num_host_hit_tokens
        outs.append(serve(engine, again))
        hits.append((bm.num_hit_tokens - before, bm.num_host_hit_tokens - host_before))
    assert hits[0] == (32, 32)  # the whole shared prefix, from host memory
    assert hits[1][0] < 32  # without the tier it was lost
    assert outs[:3] == outs[3:]  # the same tokens with and without the tier


def test_aborts_of_swapped_and_running_sequences_leak_nothing(reference):
    reqs, _ = reference
    engine, _ = create_engine(BackendConfig(num_blocks=40, host_kv_gib=0.002, **SMALL))
    serve(engine, reqs, abort_after={"r1": 3, "r3": 9, "r4": 14, "r5": 20})
    bm = engine.scheduler.block_manager
    assert bm.num_used_blocks == 0 and bm.host.num_pinned_blocks == 0
    assert not bm.host.swapped_seq_ids()


def test_host_tier_needs_prefix_caching():
    from backend.errors import ModelLoadError

    with pytest.raises(ModelLoadError):
        BackendConfig(host_kv_gib=1.0, enable_prefix_caching=False).validate()


def test_tier_counters_reach_the_load_report_and_metrics(reference):
    """What /metrics shows: the worker's LoadReport carries the tier's counters, and the gateway
    turns them into per-backend gauges (recompute vs swap preemptions, host hits, host usage)."""
    from backend.server.worker import Worker
    from gateway.prometheus_metrics import BackendLoad, GatewayMetrics
    from proto import tidegate_pb2 as pb

    reqs, _ = reference
    engine, _ = create_engine(BackendConfig(num_blocks=40, host_kv_gib=0.002, **SMALL))
    serve(engine, reqs)
    sched, bm = engine.scheduler, engine.scheduler.block_manager
    worker = SimpleNamespace(engine=engine, step_time_ema_ms=0.0, backend_id="b0",
                             num_backpressured=0, num_gateways_dropped=0, prefix_summary=None,
                             puller=SimpleNamespace(num_pulls=0, num_served=0,  # (issue 34)
                                                    prefill_tokens_per_s=0.0),
                             kv_server=None)
    load = Worker.load_report(worker)  # the worker's own report, without its sockets
    load = pb.LoadReport.FromString(load.SerializeToString())
    assert load.num_host_blocks == bm.host.num_blocks and load.num_host_hit_tokens > 0
    assert load.num_swap_preemptions == sched.num_swap_preemptions > 0
    metrics = GatewayMetrics("m")
    metrics.refresh({}, {}, [BackendLoad(
        "b0", True, 0, 0, 0.0, 0, preemptions=load.num_preemptions,
        swap_preemptions=load.num_swap_preemptions, host_hit_tokens=load.num_host_hit_tokens,
        host_kv_usage=load.num_host_used_blocks / load.num_host_blocks)])
    text = metrics.render().decode()
    swaps = sched.num_swap_preemptions
    assert f'tidegate_backend_preemptions{{backend="b0",mode="swap"}} {float(swaps)}' in text
    assert (f'tidegate_backend_preemptions{{backend="b0",mode="recompute"}} '
            f'{float(sched.num_preemptions - swaps)}') in text
    assert f'tidegate_backend_host_kv_hit_tokens{{backend="b0"}} {float(bm.num_host_hit_tokens)}' in text
