"""Issue 31: the ceiling on Retry-After within +-25% (sims.retry_after_bound). A refused
request's world is forked after its arrival: the history up to it must be the base run's (the
same state at the refusal), a future that cannot vary must give a ceiling of 100%, and random
future arrivals of higher classes under a Fast-first backend must spread the wait so that no
predictor reaches it."""
from __future__ import annotations

import numpy as np
import pytest

from scheduler.slo import SLOTargets
from sims.adapters import SimSchedulerConfig
from sims.event_loop import EngineConfig
from sims.retry_after_bound import base_run, best_r, fork_wait, fork_workload, hit, score, study
from sims.runner import CostSpec, RunSpec
from sims.workload import LengthSpec, WorkloadConfig, generate

SLOW = 2


def _spec(num_requests: int, rate: float, seed: int = 3) -> RunSpec:
    """One echo-like backend (20 ms step, 4 slots, Fast first), outputs 1-80 tokens (Fast <= 8,
    Normal <= 64, Slow above), the slot model's admission on at 2-3x its capacity."""
    return RunSpec(
        cost=CostSpec(step_ms=20.0),
        workload=WorkloadConfig(num_requests=num_requests, rate=rate, input_len=LengthSpec.parse(32),
                                output_len=LengthSpec.parse("uniform:1:80"), seed=seed),
        scheduler=SimSchedulerConfig(max_num_seqs=4, waiting_by_class=True, slot_model=True,
                                     admission=True,
                                     slo=SLOTargets.parse("fast=150,normal=400,slow=1000", None)),
        engine=EngineConfig(num_backends=1, num_samples=10))


def test_best_r_and_hit():
    assert hit(1.0, [0.8, 1.0, 1.33, 1.34, 0.79]).tolist() == [True, True, True, False, False]
    r, n = best_r([1.0, 1.1, 1.2, 5.0])
    assert n == 3 and hit(r, [1.0, 1.1, 1.2]).all()
    s = score(2.0, [1.0] * 5)
    assert s["current"] == 0.0 and s["median"] == s["best_loo"] == s["best_in"] == 1.0
    assert s["bias"] == 2.0
    # waits spread over a factor 1.5^k: one predictor hits at most two neighbours of each
    s = score(1.0, [1.5 ** k for k in range(8)])
    assert s["best_in"] == 0.25 and s["best_loo"] < 0.25


def test_fork_keeps_the_history_and_redraws_the_future():
    spec = _spec(60, 300.0)
    w = generate(spec.workload)
    f = fork_workload(w, spec.workload, 20, seed=7)
    assert np.array_equal(f.arrival_time[:21], w.arrival_time[:21])
    assert np.array_equal(f.output_len[:21], w.output_len[:21])
    assert not np.array_equal(f.arrival_time[21:], w.arrival_time[21:])
    assert (np.diff(f.arrival_time) >= 0).all() and len(f) == len(w)
    assert f.ttft_override_ms[20] > 1e6 and f.ttft_override_ms[19] is None
    same = fork_workload(w, spec.workload, 20, seed=None)
    assert np.array_equal(same.arrival_time, w.arrival_time)
    assert np.array_equal(fork_workload(w, spec.workload, 20, seed=7).arrival_time, f.arrival_time)


def test_a_future_that_cannot_vary_has_a_ceiling_of_100pct():
    """The last arrival of a run has no future to redraw: every world is the same one, its wait
    is fixed by the state at its arrival, and the best predictor hits it every time."""
    spec = _spec(50, 100.0)
    base = base_run(spec)
    last = len(base.workload) - 1
    assert last in base.retry_after_s, "the setup must refuse the last arrival"
    waits = []
    for seed in (None, 1, 2, 3):
        wk, same = fork_wait(spec, base, last, seed)
        assert same
        waits.append(wk)
    assert max(waits) == min(waits) > 0
    s = score(base.retry_after_s[last], waits)
    assert s["best_loo"] == s["median"] == 1.0


def test_random_higher_class_arrivals_bound_the_slow_prediction():
    """Slow refusals in an overloaded run with a Fast-first backend: the Fast and Normal
    requests after each decide when it gets a slot, so its wait spreads over the worlds and
    no predictor that knows the state at its arrival hits every world; the history before each
    refusal is the base run's in every world."""
    spec = _spec(100, 8.0)  # ~1.6x the backend's slots; Fast + Normal ~1.1x (at 100/s
    # the queue is so long that admission refuses the later arrivals and the waits are fixed)
    res = study(spec, forks=6, classes=[SLOW], max_refusals=4)
    s = res["summary"]["slow"]
    assert s["n"] == 4 and s["prefix_identical"]
    assert s["best_in"] < 1.0 and s["best_loo"] < 0.9
    assert s["spread_p90_over_p10_p50"] > 1.3
    for row in res["rows"]:
        assert len(row["waits_s"]) == 6 and min(row["waits_s"]) > 0
        assert 0.0 <= row["current"] <= 1.0 and set(row["alternatives"]) >= {"uncalibrated"}


def test_cli_writes_the_summary(tmp_path, capsys):
    from sims.cli import main
    out = tmp_path / "b.json"
    rc = main(["retry-bound", "--step-ms", "20", "--max-num-seqs", "4", "--waiting-by-class",
               "--slot-model", "--rate", "8", "--num-requests", "100", "--input-len", "32",
               "--output-len", "uniform:1:80", "--slo-ttft-ms", "fast=150,normal=400,slow=1000",
               "--forks", "3", "--max-refusals", "2", "--json", str(out)])
    assert rc == 0
    import json
    doc = json.loads(out.read_text())
    assert doc["summary"]["slow"]["n"] == 2 and doc["forks"] == 3
    assert "ceiling" in capsys.readouterr().out


@pytest.mark.parametrize("forks", [1])
def test_cli_rejects_one_fork(forks):
    from sims.cli import main
    with pytest.raises(SystemExit):
        main(["retry-bound", "--step-ms", "20", "--slo-ttft-ms", "1000", "--forks", str(forks)])


def test_outcome_over_seeds_counts_every_request():
    from sims.retry_after_bound import outcomes_over_seeds
    spec = _spec(100, 8.0)
    res = outcomes_over_seeds(spec, [3, 4])
    t = res["total"]
    assert sum(c["sent"] for c in t.values()) == 200
    for c in t.values():
        assert c["met"] + c["refused"] <= c["sent"] and c["missed_by_10pct"] <= c["sent"] - c["refused"]
    assert res["per_seed"][3] == outcomes_over_seeds(spec, [3])["per_seed"][3]
