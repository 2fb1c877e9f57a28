"""`tidegate sim slo` (the SLO planner) and `tidegate sim window` (the window defaults' search)."""
from __future__ import annotations

import json

import pytest

from sims.cli import main as sim_main
from sims.slo_plan import round_up
from sims.window_search import choose

# one request = 4 steps of 10 ms on a backend that runs one at a time: 25 requests/s each
SMALL = ["--step-ms", "10", "--rate", "50", "--num-requests", "400", "--input-len", "16",
         "--output-len", "4", "--max-num-seqs", "1", "--max-backends", "6"]


def test_round_up_two_significant_figures():
    assert round_up(123.4) == 130 and round_up(99.0) == 99 and round_up(0.0123) == pytest.approx(0.013)
    assert round_up(40.0) == 40


def test_planner_answers_the_smallest_count_that_meets_the_targets(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert sim_main(["slo", *SMALL, "--slo-ttft-ms", "100", "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    rows = plan["rows"]
    # 50 req/s against 25/s per backend: one backend refuses about half (and nearly every
    # request it admits meets the target), two are at capacity, three meet it for every request
    assert 0.3 < rows[0]["attainment"]["fast"] < 0.7 and 150 < rows[0]["refused"] < 250
    assert rows[0]["attainment"]["fast"] * 400 >= 0.9 * (400 - rows[0]["refused"])
    assert plan["backends"] == 3 == rows[-1]["backends"]
    assert rows[-1]["attainment"]["fast"] >= 0.99
    assert "answer: 3 backend(s)" in capsys.readouterr().out


def test_planner_proposes_targets_from_the_workload(tmp_path):
    out = tmp_path / "plan.json"
    assert sim_main(["slo", *SMALL, "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    # on enough backends a request waits at most for the one running ahead of it (4 steps)
    # and then its prefill step: <= 50 ms; twice that p99, rounded up; and the plan then meets
    # what it proposed
    ttft = float(plan["proposed"]["ttft_ms"].split("=")[1])
    assert 20 <= ttft <= 100
    assert plan["backends"] is not None


def test_window_choice_rule():
    def row(w, t, ml, good, p99, win=1.0):
        return {"workload": w, "target_throughput": t, "min_latency_ms": ml, "goodput": good,
                "ttft_p99_ms": p99, "mean_window": win}
    rows = [row("a", 8000, 5, 100, 10), row("a", 250, 5, 100, 11, 2.0),
            row("b", 8000, 5, 80, 100), row("b", 250, 5, 95, 60, 3.0)]
    out = choose(rows, 0.01)
    # 8000 loses 16% of the goodput at b: not a candidate, whatever its p99 at a
    assert (out["target_throughput"], out["min_latency_ms"]) == (250, 5)
    assert [c["ok"] for c in out["ranked"]] == [True, False]
