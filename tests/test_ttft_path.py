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


def test_delivery_path_fits_the_per_stream_cost_from_the_runs():
    """bench.serving.ttft_path.delivery_path (issue 35): runs whose out follows 0.5 + 0.07 ms x
    the streams of the first-token steps give k 0.07 and a base that keeps the lowest load's
    constant; a given k is taken as is; too few runs fit nothing (k 0: the old constant)."""
    import numpy as np

    from bench.serving.ttft_path import delivery_path

    def run(streams):
        pr = {"step_seqs": streams, "out_ms": [0.5 + 0.07 * s for s in streams], "to_step_ms": []}
        return {"http_in": 0.6, "front": 0.3, "out": float(np.median(pr["out_ms"]))}, pr

    low = [run([8, 10, 12]), run([9, 10, 11])]
    every = low + [run([30, 32, 34]), run([50, 48, 52]), run([80, 78, 82])]
    m = delivery_path(low, every)
    assert m["per_stream_ms"] == pytest.approx(0.07) and m["fit"]["num_runs"] == 5
    assert m["fit"]["r"] == pytest.approx(1.0) and m["fit"]["intercept_ms"] == pytest.approx(0.5)
    assert m["constant_ms"] == pytest.approx(0.6 + 0.3 + 0.5 + 0.7)
    # at the lowest load (10 streams) base + k x 10 is the old constant: 0.6 + 0.3 + 0.5
    assert m["base_ms"] == pytest.approx(1.4)
    given = delivery_path(low, every, per_stream_ms=0.1)
    assert given["per_stream_ms"] == 0.1 and given["base_ms"] == pytest.approx(2.1 - 1.0)
    off = delivery_path(low, every, per_stream_ms=0.0)
    assert off["per_stream_ms"] == 0.0 and off["base_ms"] == pytest.approx(off["constant_ms"])
    one = delivery_path(low[:1], low[:1])
    assert one["per_stream_ms"] == 0.0 and one["base_ms"] == pytest.approx(2.1)
    # runs recorded before the per-request lists (None): the constant alone
    old = [(m_, None) for m_, _ in low]
    assert delivery_path(old, old)["per_stream_ms"] == 0.0


def test_validate_refuses_a_negative_per_stream_cost():
    from bench.simulator import validate

    a = validate.parser().parse_args(["--delivery-per-stream-ms", "-0.1"])
    with pytest.raises(ValueError, match="delivery-per-stream-ms"):
        validate.validate(a)
