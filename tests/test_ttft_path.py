"""bench.serving.ttft_path: one request's TTFT split across the client, gateway and backend logs."""
from __future__ import annotations

import math

import pytest

from bench.serving.ttft_path import decompose
from scheduler.decisions import ArrivalRecord, BatchRecord
from sims.metrics import RequestRecord


def test_parts_add_up_to_the_client_ttft():
    # client sends at 10.000, gateway stamps 10.002, pushes 10.0021, window flushes 10.004, the
    # prefill runs in two chunks 10.010-10.030 and 10.030-10.045, the client sees the token at 10.050
    rec = RequestRecord(index=0, prompt_len=40, max_tokens=4, send_time=10.0, chunk_times=[10.05],
                        chunk_tokens=[1], output_tokens=4)
    arr = ArrivalRecord("a", 10.0021, 40, 4, 0, received=10.002)
    batch = BatchRecord(10.004, ("a",), (0,))
    steps = [{"mono": 10.010, "ms": 20.0, "prefill": [["a", 24, 0]]},
             {"mono": 10.030, "ms": 15.0, "prefill": [["a", 16, 24]]},
             {"mono": 10.045, "ms": 5.0, "prefill": []}]
    p = decompose([rec], [arr], [batch], steps)
    assert p["num_requests"] == 1 and p["mismatched"] == 0
    assert p["http_in"] == pytest.approx(2.0) and p["front"] == pytest.approx(0.1)
    assert p["window"] == pytest.approx(1.9) and p["to_step"] == pytest.approx(6.0)
    assert p["prefill"] == pytest.approx(35.0) and p["out"] == pytest.approx(5.0)
    assert p["ttft"] == pytest.approx(50.0)
    assert "per_request" not in p
    q = decompose([rec], [arr], [batch], [dict(r, decodes=3) for r in steps], per_request=True)
    # its first token came from the second step: 3 decodes + its own chunk
    assert q["per_request"]["step_seqs"] == [4] and q["per_request"]["out_ms"] == [pytest.approx(5.0)]
    assert q["per_request"]["to_step_ms"] == [pytest.approx(6.0)]


def test_a_request_missing_from_a_log_is_counted_not_guessed():
    rec = RequestRecord(index=0, prompt_len=8, max_tokens=2, send_time=1.0, chunk_times=[1.1],
                        chunk_tokens=[1], output_tokens=2)
    arr = ArrivalRecord("a", 1.01, 8, 2, 0, received=1.005)
    p = decompose([rec], [arr], [BatchRecord(1.02, ("a",), (0,))], [])  # no step log rows
    assert p["num_requests"] == 0 and p["mismatched"] == 1 and math.isnan(p["out"])


def test_delivery_delay_moves_every_token_by_the_same_time():
    """EngineConfig.delivery_delay_s: TTFT and E2E grow by exactly the delay, TPOT and the
    simulated decisions do not change (closed form)."""
    import numpy as np

    from sims.adapters import SimSchedulerConfig
    from sims.cost import ConstantCost
    from sims.event_loop import EngineConfig, simulate
    from sims.workload import LengthSpec, WorkloadConfig, generate

    w = generate(WorkloadConfig(num_requests=60, rate=40.0, input_len=LengthSpec("fixed", 64),
                                output_len=LengthSpec.parse("uniform:2:20"), seed=3))
    base = simulate(w, ConstantCost(0.01), SimSchedulerConfig(), EngineConfig(num_samples=1))
    late = simulate(w, ConstantCost(0.01), SimSchedulerConfig(),
                    EngineConfig(num_samples=1, delivery_delay_s=0.0045))
    np.testing.assert_allclose(late.first_token_time - base.first_token_time, 0.0045, atol=1e-12)
    np.testing.assert_allclose(late.finish_time - base.finish_time, 0.0045, atol=1e-12)
    np.testing.assert_array_equal(late.dispatch_time, base.dispatch_time)
    np.testing.assert_array_equal(late.step_time, base.step_time)
