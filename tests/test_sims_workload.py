"""Workloads: arrival processes, length distributions, traces, determinism."""
import numpy as np
import pytest

from sims.workload import LengthSpec, WorkloadConfig, generate, load_trace, write_trace


def test_poisson_rate_and_determinism():
    cfg = WorkloadConfig(num_requests=20000, rate=50.0, seed=3)
    a, b = generate(cfg), generate(cfg)
    np.testing.assert_array_equal(a.arrival_time, b.arrival_time)
    gaps = np.diff(a.arrival_time)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)
    assert not np.array_equal(generate(WorkloadConfig(num_requests=100, seed=4)).arrival_time,
                              a.arrival_time[:100])


def test_gamma_burstiness_sets_the_cv():
    w = generate(WorkloadConfig(num_requests=20000, rate=10.0, arrival="gamma", cv=3.0, seed=1))
    gaps = np.diff(w.arrival_time)
    assert gaps.mean() == pytest.approx(0.1, rel=0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.08)


@pytest.mark.parametrize("text,check", [
    ("512", lambda x: (x == 512).all()),
    ("uniform:10:20", lambda x: x.min() == 10 and x.max() == 20),
    ("lognormal:256:0.5", lambda x: abs(np.median(x) - 256) < 10),
])
def test_length_specs(text, check):
    assert check(LengthSpec.parse(text).sample(np.random.default_rng(0), 5000))


def test_a_capped_lognormal_is_the_validates_draws():
    """`lognormal:MEDIAN:SIGMA:MAX` caps the draws as `sim validate` does (4x the mean), so `sim run`
    can replay a validated workload: the same draws, the long tail cut at MAX."""
    from bench.simulator.validate import length_spec
    capped = LengthSpec.parse("lognormal:512:0.8:2820")
    assert capped == length_spec("lognormal:512:0.8") and capped.max_len == 2820
    a = capped.sample(np.random.default_rng(7), 20000)
    b = LengthSpec.parse("lognormal:512:0.8").sample(np.random.default_rng(7), 20000)
    assert a.max() == 2820 < b.max()
    np.testing.assert_array_equal(a, np.minimum(b, 2820))
    for bad in ("lognormal:512:0.8:0", "lognormal:512:0.8:x", "lognormal:512:0.8:1:2"):
        with pytest.raises(ValueError):
            LengthSpec.parse(bad)


def test_bad_length_spec():
    with pytest.raises(ValueError):
        LengthSpec.parse("normal:3")
    with pytest.raises(ValueError):
        LengthSpec.parse("trace")


def test_shared_prefix_fraction():
    w = generate(WorkloadConfig(num_requests=10000, shared_prefix_fraction=0.3,
                                shared_prefix_len=128, num_prefix_groups=4, seed=2))
    shared = w.prefix_group >= 0
    assert shared.mean() == pytest.approx(0.3, abs=0.02)
    assert set(np.unique(w.prefix_group[shared])) == {0, 1, 2, 3}
    assert (w.prompt_len[shared] > 128).all()


def test_trace_round_trip_and_replay(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_time": 0.5, "prompt_tokens": 10, "output_tokens": 3, "class": "fast"}\n'
                    '{"timestamp": 0.1, "input_len": 20, "output_len": 70, "priority": 2}\n')
    tr = load_trace(path)
    assert tr.arrival_time.tolist() == [0.1, 0.5] and tr.prompt_len.tolist() == [20, 10]
    assert tr.queue_class.tolist() == [-1, 0] and tr.priority.tolist() == [2, 0]
    write_trace(tr, tmp_path / "u.jsonl")
    assert load_trace(tmp_path / "u.jsonl").output_len.tolist() == [70, 3]
    w = generate(WorkloadConfig(num_requests=5, arrival="trace",
                                output_len=LengthSpec.parse("trace", tuple(tr.output_len))), tr)
    assert np.all(np.diff(w.arrival_time) > 0) and set(w.output_len) <= {3, 70}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_trace(bad)
