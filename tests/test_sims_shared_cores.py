"""Backends sharing their processors in the simulator (sims.shared_cores, issue 34): processor
sharing of the steps in progress, against closed forms on a cost model with fixed step times."""
import numpy as np
import pytest

from scheduler.batcher import BatcherConfig
from scheduler.placement import PlacementConfig
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.event_loop import EngineConfig, simulate
from sims.shared_cores import SharedCoreLoop, SharedCores, gpu_time_slicing, simulate_shared
from tests.sim_helpers import DECODE_S, PREFILL_S, TwoSpeedCost, workload

# windows of one, flushed at once: the arrivals reach their backends when they come
ONE_BY_ONE = SimSchedulerConfig(batcher=BatcherConfig(target_throughput=8000.0))


def engine(backends):
    return EngineConfig(num_backends=backends, num_samples=1, max_stretch_steps=1,
                        placement=PlacementConfig(policy="least-tokens"))


def run(w, backends, law):
    if law is None:
        return simulate(w, TwoSpeedCost(), ONE_BY_ONE, engine(backends))
    return simulate_shared(w, TwoSpeedCost(), ONE_BY_ONE, engine(backends), law)


@pytest.mark.parametrize("out", [1, 40])
def test_two_backends_always_busy_on_one_core_take_twice_as_long(out):
    w = workload([0.0, 0.0], [out, out])  # one each (least tokens), in lockstep
    own = run(w, 2, None)
    solo = PREFILL_S + (out - 1) * DECODE_S
    d = own.dispatch_time
    assert d[0] == d[1]
    np.testing.assert_allclose(own.finish_time - d, solo)
    one = run(w, 2, SharedCores(cores=1))
    np.testing.assert_allclose(one.first_token_time - d, 2 * PREFILL_S)
    np.testing.assert_allclose(one.finish_time - d, 2 * solo)  # the closed form: 2x
    two = run(w, 2, SharedCores(cores=2))  # a core each: as if alone
    np.testing.assert_allclose(two.finish_time, own.finish_time)
    # the ITL records carry the shared durations
    assert one.step_time.sum() == pytest.approx(2 * own.step_time.sum())


def test_four_backends_on_two_cores_and_reserved_cores():
    w = workload([0.0] * 4, [10] * 4)
    d = run(w, 4, None).dispatch_time
    solo = PREFILL_S + 9 * DECODE_S
    np.testing.assert_allclose(run(w, 4, SharedCores(cores=2)).finish_time - d, 2 * solo)
    # two threads a step on 4 cores: the same
    np.testing.assert_allclose(run(w, 4, SharedCores(cores=4, threads=2)).finish_time - d, 2 * solo)
    # 1.5 of 3.5 cores reserved for processes outside the simulation: 2 left for the 4 steps
    np.testing.assert_allclose(
        run(w, 4, SharedCores(cores=3.5, reserved_cores=1.5)).finish_time - d, 2 * solo)
    # 8 cores for 4 backends: no slowdown
    np.testing.assert_allclose(run(w, 4, SharedCores(cores=8)).finish_time - d, solo)


def test_a_step_speeds_up_when_the_other_backend_stops():
    """A's prefill starts alone; B's starts 50 ms later; one core. A runs alone at rate 1 until
    B starts (x = dB - dA of its work), then both at 1/2: A ends at dB + 2 (0.1 - x); B has
    done 0.1 - x by then and runs its last x alone: it ends x later."""
    w = workload([0.0, 0.05], [1, 1])
    d = run(w, 2, None).dispatch_time
    x = d[1] - d[0]
    assert 0.04 < x < PREFILL_S
    res = run(w, 2, SharedCores(cores=1))
    a_end = d[1] + 2 * (PREFILL_S - x)
    assert res.finish_time[0] == pytest.approx(a_end)
    assert res.finish_time[1] == pytest.approx(a_end + x)
    # without the re-rating (each step charged by the busy count at its start) A would end at
    # d[0] + 0.1 and B at d[1] + 0.2: neither matches
    assert res.finish_time[0] > d[0] + PREFILL_S + 1e-3
    assert res.finish_time[1] < d[1] + 2 * PREFILL_S - 1e-3


def test_gpu_time_slicing_law():
    w = workload([0.0, 0.0], [5, 5])
    d = run(w, 2, None).dispatch_time
    solo = PREFILL_S + 4 * DECODE_S
    np.testing.assert_allclose(run(w, 2, gpu_time_slicing(2.3)).finish_time - d, 2.3 * solo)
    # alone: as fast as its own device
    w1 = workload([0.0], [5])
    np.testing.assert_allclose(run(w1, 2, gpu_time_slicing(2.3)).finish_time
                               - run(w1, 2, None).dispatch_time, solo)


def test_bad_configs():
    with pytest.raises(ValueError):
        SharedCores(cores=2, reserved_cores=2)
    with pytest.raises(ValueError):
        SharedCores(cores=0)
    w = workload([0.0], [1])
    with pytest.raises(ValueError):
        SharedCoreLoop(w, TwoSpeedCost(), ONE_BY_ONE,
                       EngineConfig(num_backends=1, num_prefill_backends=1), SharedCores(1))


def test_many_requests_every_one_finishes_and_sharing_costs_time():
    """A random trace on 4 backends: every request finishes, the pools' books balance, and two
    shared cores give longer latencies than four cores (as fast as alone, identical)."""
    rng = np.random.default_rng(0)
    n = 300
    w = workload(np.sort(rng.uniform(0, 3.0, n)).tolist(), rng.integers(1, 20, n).tolist())
    own = run(w, 4, None)
    loop = SharedCoreLoop(w, TwoSpeedCost(), ONE_BY_ONE, engine(4), SharedCores(cores=4))
    four = loop.run()
    np.testing.assert_allclose(four.finish_time, own.finish_time)
    loop = SharedCoreLoop(w, TwoSpeedCost(), ONE_BY_ONE, engine(4), SharedCores(cores=2))
    two = loop.run()
    assert np.isfinite(two.finish_time).all()
    for be in loop.backends:
        be.sched.bm.check_integrity()
        assert be.sched.bm.num_used_blocks == 0
    assert np.mean(two.finish_time - w.arrival_time) > 1.2 * np.mean(own.finish_time - w.arrival_time)
    assert two.extra["shared_cores"]["max_busy"] >= 3 and two.extra["shared_cores"]["extra_step_s"] > 0


PROFILE = "bench/results/kv_pull_cpu/tiny_cpu_profile.json"  # tiny on this repo's CPU box


def test_the_pull_study_on_two_shared_cores(tmp_path):
    """kv_pull_study pull --shared-cores 2: four tiny backends of one thread on two cores run
    out of CPU at a rate that four cores (a device each) serve without a miss."""
    import json

    from sims import kv_pull_study

    def goodput(*extra):
        out = tmp_path / "x.json"
        kv_pull_study.main(["pull", "--profile", PROFILE, "--seeds", "1", "--num-requests", "400",
                            "--rates", "40", "--json", str(out), *extra])
        doc = json.loads(out.read_text())
        return doc["goodput_off"][0], doc["runs"]

    own, _ = goodput()
    shared, runs = goodput("--shared-cores", "2")
    assert own > 0.99 and shared < 0.5  # 1.000 and 0.065 measured
    assert runs[0]["shared_cores"]["max_busy"] == 4
    # the same two cores with none of them taken and a core a backend: as a device each
    four, _ = goodput("--shared-cores", "4")
    assert four == own


def test_step_host_time_from_a_lone_backends_step_log(tmp_path):
    import gzip
    import json

    from sims.kv_pull_study import Slowed, _step_log_rows, step_host_from_step_logs

    s = Slowed(ConstantCost(0.010), 1.0, 0.002)
    assert s.step_time(1, 0, 10) == pytest.approx(0.012) and s.step_time(0, 0, 0) == 0.0
    assert s.decode_span(2, 10, 3) == pytest.approx(0.036)
    # a step log whose decode steps run 0.7 ms past the profile's time (prefill steps 5 ms)
    path = tmp_path / "steps.jsonl.gz"
    rows = [{"mono": i, "ms": 0.0, "decodes": d, "prefill_tokens": p,
             "prefill": [["r", p, 0]] if p else []}
            for i, (d, p) in enumerate([(1, 0), (3, 0), (8, 0), (0, 64), (2, 1024)])]
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    solo = [m for _, m, _, _ in _step_log_rows(PROFILE, [str(path)])]
    for r, m in zip(rows, solo):
        r["ms"] = 1e3 * m + (0.7 if not r["prefill_tokens"] else 5.0)
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    assert step_host_from_step_logs(PROFILE, [str(path)]) == pytest.approx(0.7e-3, abs=1e-6)
