"""bench.simulator.fidelity_resim on the committed H200 session (issue 18): the simulator, given the prompts'
identity across runs, reproduces what the live engine's prefix cache did; without it, it cannot.

The data is the first H200 `sim validate` run (bench/results/fidelity_h200, 33B preset, 512/128,
3 seeds x 80 requests at 0.5/0.8/0.95x), in which every load of a seed sent the same prompts.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.simulator.fidelity_resim import prompt_identity, resimulate
from scheduler.decisions import read_log

RES = Path(__file__).resolve().parents[1] / "bench" / "results" / "fidelity_h200"


@pytest.fixture(scope="module")
def session():
    validate = json.loads((RES / "validate_33b.json").read_text())
    arrivals, batches = read_log(str(RES / "decisions_33b.jsonl.gz"))
    return validate, arrivals, batches


def test_identity_follows_the_order_sim_validate_sends_in(session):
    validate, arrivals, _ = session
    groups, runs = prompt_identity(validate["config"], len(arrivals))
    n, warm = 80, 10
    assert len(arrivals) == warm + 9 * n
    # request 5 of seed 1 is one prompt at all three loads, and no other request's
    g = [groups[warm + (3 + li) * n + 5] for li in range(3)]
    assert g[0] == g[1] == g[2] and groups.count(g[0]) == 3
    assert runs[warm + 4 * n] == (1, 1)
    with pytest.raises(ValueError, match="arrivals"):
        prompt_identity(validate["config"], len(arrivals) - 1)


@pytest.mark.slow
def test_prefix_cache_across_runs_explains_the_high_load_error(session):
    validate, arrivals, _ = session
    profile = str(RES / "profile_33b.json")
    with_id = resimulate(validate, arrivals, profile)
    without = resimulate(validate, arrivals, profile, prompt_identity_on=False)
    for ld, ctl in zip(with_id["loads"][1:], without["loads"][1:], strict=True):  # 0.8x, 0.95x
        assert abs(ld["summary"]["tpot_p50"]["rel_err"]["mean"]) < 0.05, ld["load_label"]
        assert abs(ld["summary"]["throughput"]["rel_err"]["mean"]) < 0.02
        assert ctl["summary"]["tpot_p50"]["rel_err"]["mean"] > 0.30  # prefilling in full
        assert ctl["summary"]["ttft_p50"]["rel_err"]["mean"] > 1.0
    # the first load of each seed had nothing cached: both agree there
    a, b = with_id["loads"][0]["summary"], without["loads"][0]["summary"]
    assert abs(a["tpot_p50"]["sim"]["mean"] - b["tpot_p50"]["sim"]["mean"]) < 0.5
