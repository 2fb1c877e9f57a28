"""sims.workload for the live load generator: schedules equal to the simulator's workloads for the
same seed, traces, prompts."""
from __future__ import annotations

import math

import numpy as np
import pytest

import sims.workload as sw
from sims.workload import LengthSpec, ScheduleConfig, make_prompts, make_schedule
from sims.workload import trace_schedule as load_trace

CASES = [
    # bench config kwargs, sims config kwargs
    ({"rate": 5.0}, {"rate": 5.0, "arrival": "poisson"}),
    ({"rate": 50.0, "burstiness": 4.0, "input_len": "uniform:10:100",
      "output_len": "lognormal:64:0.5"},
     {"rate": 50.0, "arrival": "gamma", "cv": 0.5, "input_len": "uniform:10:100",
      "output_len": "lognormal:64:0.5"}),
    ({"rate": 8.0, "burstiness": 0.25, "input_len": "300", "output_len": "uniform:1:200",
      "shared_prefix_fraction": 0.5, "shared_prefix_len": 16, "num_prefix_groups": 3},
     {"rate": 8.0, "arrival": "gamma", "cv": 2.0, "input_len": "300", "output_len": "uniform:1:200",
      "shared_prefix_fraction": 0.5, "shared_prefix_len": 16, "num_prefix_groups": 3}),
]


def bench_config(seed, n, input_len="512", output_len="128", **kw):
    return ScheduleConfig(num_requests=n, seed=seed, input_len=LengthSpec.parse(input_len),
                          output_len=LengthSpec.parse(output_len), **kw)


def sims_config(seed, n, input_len="512", output_len="128", **kw):
    return sw.WorkloadConfig(num_requests=n, seed=seed, input_len=sw.LengthSpec.parse(input_len),
                             output_len=sw.LengthSpec.parse(output_len), **kw)


@pytest.mark.parametrize("bench_kw,sims_kw", CASES)
@pytest.mark.parametrize("seed", [0, 11])
def test_schedule_equals_the_simulators_workload(bench_kw, sims_kw, seed):
    ours = make_schedule(bench_config(seed, 500, **bench_kw))
    theirs = sw.generate(sims_config(seed, 500, **sims_kw))
    assert ours.offset[0] == 0.0
    np.testing.assert_array_equal(ours.offset, theirs.arrival_time - theirs.arrival_time[0])
    np.testing.assert_array_equal(ours.prompt_len, theirs.prompt_len)
    np.testing.assert_array_equal(ours.output_len, theirs.output_len)
    np.testing.assert_array_equal(ours.prefix_group, theirs.prefix_group)
    np.testing.assert_array_equal(ours.prefix_len, theirs.prefix_len)


def test_arrival_statistics():
    s = make_schedule(bench_config(1, 20000, rate=10.0))
    gaps = np.diff(s.offset)
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)      # Poisson: cv 1
    b = np.diff(make_schedule(bench_config(1, 20000, rate=10.0, burstiness=0.25)).offset)
    assert b.mean() == pytest.approx(0.1, rel=0.05)
    assert b.std() / b.mean() == pytest.approx(2.0, rel=0.08)            # cv = 1/sqrt(0.25)
    inf = make_schedule(bench_config(1, 50, rate=math.inf))
    assert not inf.offset.any()


def test_trace_round_trip_with_the_simulators_format(tmp_path):
    wl = sw.generate(sims_config(3, 40, rate=4.0, arrival="poisson", input_len="uniform:5:50"))
    path = tmp_path / "t.jsonl"
    sw.write_trace(wl, path)
    ours = load_trace(str(path))
    np.testing.assert_array_equal(ours.offset, wl.arrival_time - wl.arrival_time[0])
    np.testing.assert_array_equal(ours.prompt_len, wl.prompt_len)
    np.testing.assert_array_equal(ours.output_len, wl.output_len)
    # more requests than lines: the trace repeats, as in the simulator
    cycled = load_trace(str(path), 100)
    theirs = sw.generate(sims_config(0, 100, arrival="trace"), trace=sw.load_trace(path))
    np.testing.assert_allclose(cycled.offset, theirs.arrival_time - theirs.arrival_time[0],
                               rtol=0, atol=1e-12)
    np.testing.assert_array_equal(cycled.prompt_len, np.tile(wl.prompt_len, 3)[:100])


def test_trace_aliases_order_and_errors(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"timestamp": 2.5, "input_len": 7, "max_tokens": 3}\n\n'
                    '{"time": 1.0, "prompt_len": 4, "output_len": 9, "class": "fast"}\n')
    s = load_trace(str(path))
    assert s.offset.tolist() == [0.0, 1.5]
    assert s.prompt_len.tolist() == [4, 7] and s.output_len.tolist() == [9, 3]
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"arrival_time": 0, "prompt_tokens": 3, "output_tokens": 2}\n{"x": 1}\n')
    with pytest.raises(ValueError, match="b.jsonl:2"):
        load_trace(str(bad))
    empty = tmp_path / "c.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_trace(str(empty))


def test_prompts_exact_lengths_range_prefixes_and_determinism():
    cfg = bench_config(5, 200, rate=10.0, input_len="uniform:20:60", shared_prefix_fraction=0.5,
                       shared_prefix_len=16, num_prefix_groups=2)
    s = make_schedule(cfg)
    prompts = make_prompts(s, 5, (100, 200))
    assert [len(p) for p in prompts] == s.prompt_len.tolist()
    assert all(100 <= t < 200 for p in prompts for t in p)
    heads = {}
    for p, g in zip(prompts, s.prefix_group):
        if g >= 0:
            assert heads.setdefault(int(g), p[:16]) == p[:16]
    assert len(heads) == 2 and heads[0] != heads[1]
    assert make_prompts(s, 5, (100, 200)) == prompts
    assert make_prompts(s, 6, (100, 200)) != prompts
    with pytest.raises(ValueError):
        make_prompts(s, 5, (10, 10))


def test_length_spec_parse():
    assert LengthSpec.parse("64") == LengthSpec("fixed", value=64)
    assert LengthSpec.parse("uniform:1:8").high == 8
    assert LengthSpec.parse("lognormal:100:0.3").sigma == 0.3
    for bad in ("uniform:1", "normal:3:4", "x", "uniform:a:b"):
        with pytest.raises(ValueError):
            LengthSpec.parse(bad)
    with pytest.raises(ValueError):
        make_schedule(bench_config(0, 10, rate=0.0))
