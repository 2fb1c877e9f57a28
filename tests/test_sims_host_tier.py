"""The simulator's host KV tier: the real HostTier under the event loop, copies charged at the
given bandwidth (closed form on sequential requests), and the host memory a workload needs."""
import numpy as np
import pytest

from sims.adapters import HostTierCost, SimSchedulerConfig
from sims.cost import ConstantCost
from sims.event_loop import EngineConfig, simulate
from sims.report import summarize
from sims.workload import LengthSpec, WorkloadConfig, generate

S = 0.001  # seconds per step


class KVConstantCost(ConstantCost):
    kv_bytes_per_token = 1000  # what the tier needs to size its blocks


def _run(host_kv_gib, gbps=100.0):
    # prefix groups of 4 blocks, 6 groups: 24 blocks of prefixes for a 12-block pool; requests far
    # 0.5 s apart (each is one prefill step, done before the next arrives)
    w = generate(WorkloadConfig(num_requests=60, rate=2.0, arrival="gamma", cv=0.01,
                                input_len=LengthSpec("fixed", 80),
                                output_len=LengthSpec.parse("1"), shared_prefix_fraction=1.0,
                                shared_prefix_len=64, num_prefix_groups=6, seed=3))
    sched = SimSchedulerConfig(max_num_seqs=4, max_model_len=256, enable_prefix_caching=True,
                               host_kv_gib=host_kv_gib, host_copy_gbps=gbps)
    r = simulate(w, KVConstantCost(S, num_blocks=12), sched, EngineConfig())
    return r, summarize(r)


def test_host_tier_cost_from_the_cost_model():
    cfg = SimSchedulerConfig(host_kv_gib=1.0, host_copy_gbps=2.0)
    host = HostTierCost.for_cost_model(cfg, KVConstantCost(S))
    assert host.block_bytes == 16 * 1000 and host.num_blocks == 2**30 // 16000
    assert host.copy_s_per_block == pytest.approx(16000 / 2e9)
    assert host.prefill_s_per_token == pytest.approx(S / 2048)
    assert HostTierCost.for_cost_model(SimSchedulerConfig(), KVConstantCost(S)) is None


def test_copies_are_charged_at_the_bandwidth_and_prefixes_hit_from_host():
    off_r, off = _run(0.0)
    on_r, on = _run(0.01)
    tier = on["host_tier"]
    assert not off["host_tier"] and tier["host_hit_tokens"] > 0
    assert on["kv"]["prefix_hit_rate"] > off["kv"]["prefix_hit_rate"]
    # every request is one step taken at once: S, plus its step's tier copies
    np.testing.assert_allclose(off_r.first_token_time - off_r.dispatch_time, S, rtol=1e-9)
    copy_s = 16000 / 100e9  # one block at 100 GB/s
    extra = (on_r.first_token_time - on_r.dispatch_time - S).sum()
    assert extra == pytest.approx((tier["saved_blocks"] + tier["loaded_blocks"]) * copy_s)
    # the host memory the workload needed: every prefix block it saved, never dropped
    assert tier["dropped_blocks"] == 0
    # (host blocks are only ever reused by dropping: the peak is every block saved)
    assert tier["peak_gib_per_backend"] * 2**30 == pytest.approx(tier["saved_blocks"] * 16000)


def test_a_slow_link_recomputes_host_hits():
    """At 1 MB/s a block takes 16 ms to copy back and 8 us to prefill (S / 2048 per token): the
    rule (SwapCostModel.should_load) recomputes; evicted blocks are still saved."""
    _, rep = _run(0.01, gbps=1e-3)
    assert rep["host_tier"]["host_hit_tokens"] == 0 and rep["host_tier"]["saved_blocks"] > 0
