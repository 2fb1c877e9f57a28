"""EngineConfig.delivery_per_stream_s (issue 35): the client sees a token delivery_delay_s +
delivery_per_stream_s x (the streams of the step that produced it) after that step's end; the
schedule itself does not move. Closed forms on ConstantCost, one backend."""
from __future__ import annotations

import numpy as np
import pytest

from scheduler.batcher import BatcherConfig
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.event_loop import EngineConfig, simulate
from sims.workload import LengthSpec, WorkloadConfig, generate

BASE, K = 0.0017, 0.00007  # the 6.7B's fit: ~1.7 ms + 70 us a stream


def _burst(n: int, out: int):
    w = generate(WorkloadConfig(num_requests=n, rate=1.0, input_len=LengthSpec("fixed", 16),
                                output_len=LengthSpec("fixed", out), seed=1))
    w.arrival_time[:] = 0.0  # all at once: one window, one prefill step of n chunks
    return w


@pytest.mark.parametrize("n", [1, 5, 12])
def test_n_streams_in_one_step_shift_by_base_plus_k_n(n):
    w = _burst(n, 4)
    cost = ConstantCost(0.01)
    one_window = SimSchedulerConfig(batcher=BatcherConfig(idle_flush=False))  # the 5 ms window
    plain = simulate(w, cost, one_window, EngineConfig(num_samples=1))
    path = simulate(w, cost, one_window,
                    EngineConfig(num_samples=1, delivery_delay_s=BASE, delivery_per_stream_s=K))
    # the n prompts prefill together: every first token from a step of n streams, and every
    # request decodes its 3 more tokens beside the others (its last step has n streams too)
    assert len(set(plain.first_token_time.tolist())) == 1
    np.testing.assert_allclose(path.first_token_time - plain.first_token_time, BASE + K * n, atol=1e-12)
    np.testing.assert_allclose(path.finish_time - plain.finish_time, BASE + K * n, atol=1e-12)
    np.testing.assert_array_equal(path.dispatch_time, plain.dispatch_time)
    np.testing.assert_array_equal(path.step_time, plain.step_time)


def test_each_token_gets_its_own_steps_streams():
    """Poisson arrivals, step by step: each request's first token shifts by BASE + K x the
    decodes + prefill chunks of the step that gave it (from the step record), its last token
    by BASE + K x the sequences of the step it finished in; default 0: as before."""
    w = generate(WorkloadConfig(num_requests=80, rate=60.0, input_len=LengthSpec("fixed", 64),
                                output_len=LengthSpec.parse("uniform:2:30"), seed=5))
    cost = ConstantCost(0.01)
    cfg = {"num_samples": 1, "max_stretch_steps": 1, "record_steps": True}
    plain = simulate(w, cost, SimSchedulerConfig(), EngineConfig(**cfg))
    zero = simulate(w, cost, SimSchedulerConfig(), EngineConfig(**cfg, delivery_per_stream_s=0.0))
    np.testing.assert_array_equal(zero.first_token_time, plain.first_token_time)
    path = simulate(w, cost, SimSchedulerConfig(),
                    EngineConfig(**cfg, delivery_delay_s=BASE, delivery_per_stream_s=K))
    first_n, n_at_end = {}, {}
    for t, _b, dec, chunks, _pre in plain.extra["steps"]:
        for rid, _tok, _pos in chunks:
            first_n.setdefault(rid, dec + len(chunks))  # one chunk each: 64 tokens fit
        n_at_end[round(t + 0.01, 9)] = dec + len(chunks)
    shift = path.first_token_time - plain.first_token_time
    want = np.array([BASE + K * first_n[i] for i in range(len(shift))])
    np.testing.assert_allclose(shift, want, atol=1e-12)
    assert len(set(first_n.values())) > 3  # the load varied: not one constant in disguise
    fin = np.array([BASE + K * n_at_end[round(t, 9)] for t in plain.finish_time])
    np.testing.assert_allclose(path.finish_time - plain.finish_time, fin, atol=1e-12)


def test_stretches_charge_their_segments_streams():
    """With multi-step stretches the finishes get the same path as stepping one step at a time."""
    w = generate(WorkloadConfig(num_requests=60, rate=30.0, input_len=LengthSpec("fixed", 32),
                                output_len=LengthSpec.parse("uniform:2:40"), seed=7))
    cost = ConstantCost(0.01)
    eng = {"num_samples": 1, "delivery_delay_s": BASE, "delivery_per_stream_s": K}
    one = simulate(w, cost, SimSchedulerConfig(), EngineConfig(**eng, max_stretch_steps=1))
    many = simulate(w, cost, SimSchedulerConfig(), EngineConfig(**eng, max_stretch_finishes=4))
    np.testing.assert_allclose(many.first_token_time, one.first_token_time, atol=1e-9)
    np.testing.assert_allclose(many.finish_time, one.finish_time, atol=1e-9)


def test_the_cli_flag_sets_the_knob():
    import argparse

    from sims.options import add_run_args, parse_with_config, spec_from_args

    def engine(*argv):
        p = argparse.ArgumentParser()
        add_run_args(p)
        return spec_from_args(parse_with_config(p, list(argv))).engine

    assert engine().delivery_per_stream_s == 0.0
    assert engine("--delivery-per-stream-ms", "0.07").delivery_per_stream_s == pytest.approx(7e-5)
    with pytest.raises(ValueError, match="delivery-per-stream-ms"):
        engine("--delivery-per-stream-ms", "-1")
