"""The serving benchmark (`bench/serving/suite.py`): what it computes from a step log is checked
against hand-made logs with known answers, and one tiny end-to-end run on the CPU checks that the
client's numbers and the backend's step log come out of the same run."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.serving.suite import WORKLOADS, issue11_goals, run_seed, step_model, step_summary

ROOT = Path(__file__).parents[1]


def _row(t, ms, decodes, prefill=0, chunks=0):
    return {"t": t, "ms": ms, "decodes": decodes, "prefill_tokens": prefill,
            "prefill_chunks": chunks}


def test_step_summary_closed_forms():
    # inside the window [10, 20): two decode steps of 4 streams at 20 ms, one step with a 100-token
    # prefill and 4 decodes at 60 ms; outside it, steps that must not count
    rows = [_row(9.9, 500, 4), _row(10.0, 20, 4), _row(10.1, 60, 4, 100, 1), _row(10.2, 20, 4),
            _row(20.0, 500, 4)]
    s = step_summary(rows, 10.0, 20.0)
    assert s["num_steps"] == 3 and s["num_prefill_steps"] == 1
    assert s["busy_ms"] == 100 and s["busy_fraction"] == pytest.approx(0.01)
    # each decoding token waits, on average, (20*4 + 60*4 + 20*4) / 12 ms
    assert s["allowed_tpot_ms"] == pytest.approx(400 / 12)
    assert s["decode_only_ms_p50"] == 20 and s["prefill_step_ms_mean"] == 60
    assert s["prefill_tokens_per_step_mean"] == 100
    assert math.isnan(s["decode_b1_ms_p50"]) and s["num_decode_b1_steps"] == 0


def test_device_time_beside_the_cadence():
    # two decode steps timed on the device at 20 and 30 ms whose cadence was 21 and 30 (the first
    # waited 1 ms for the host), a prefill step timed at 60 ms, and a step with no device time
    rows = [_row(1.0, 21, 4) | {"device_ms": 20}, _row(1.1, 30, 4) | {"device_ms": 30},
            _row(1.2, 60, 4, 100, 1) | {"device_ms": 60}, _row(1.3, 25, 4)]
    s = step_summary(rows, 0.0, 2.0)
    assert s["num_device_timed_steps"] == 3 and s["device_ms_sum"] == 110
    assert s["host_wait_ms_sum"] == pytest.approx(1.0)
    assert s["decode_only_device_ms_p50"] == 20 and s["decode_only_device_ms_max"] == 30
    assert s["prefill_step_device_ms_mean"] == 60
    assert step_summary([_row(1.0, 21, 4)], 0.0, 2.0)["num_device_timed_steps"] == 0


def test_step_model_recovers_a_linear_cost():
    rows = [_row(i, 18 + 0.1 * p + 0.2 * d, d, p, 1 if p else 0)
            for i, (p, d) in enumerate([(0, 1), (0, 30), (512, 3), (256, 20), (2000, 0), (16, 7)])]
    m = step_model(rows)
    assert m["fit"]["a_ms"] == pytest.approx(18)
    assert m["fit"]["ms_per_prefill_token"] == pytest.approx(0.1)
    assert m["fit"]["ms_per_decode"] == pytest.approx(0.2)
    assert m["by_prefill_tokens"]["257-512"]["steps"] == 1


def test_issue11_goals_compare_with_the_issue_bounds():
    engine = {"busy_ms": 2000.0, "allowed_tpot_ms": 30.0}
    rows = [
        {"config": "x", "workload": "short_2rps", "total_output_tokens": 1280, "engine": engine,
         "client": {"ttft_p50": 29.0, "itl_p50": 20.0, "itl_p99": 27.0, "tpot_p50": 20.0,
                    "output_throughput": 55.0}},
        {"config": "x", "workload": "long_burst", "total_output_tokens": 4000, "engine": engine,
         "client": {"ttft_p50": 900.0, "itl_p50": 40.0, "itl_p99": 90.0, "tpot_p50": 60.0,
                    "output_throughput": 1800.0}},
    ]
    lines = issue11_goals(rows).splitlines()[2:]
    met = [line.rsplit("|", 2)[1].strip() for line in lines]
    # TTFT 29 <= 30 yes; ITL 27 > 1.3 * 20 no; 1,800 >= 1,700 yes; 1,800 / 2,000 = 90% >= 85% yes
    assert met == ["yes", "no", "yes", "yes"]


@pytest.mark.slow
def test_suite_end_to_end_on_the_cpu(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.serving.suite", "--out", str(tmp_path), "--workloads", "tiny",
         "--config", "a=@short_burst,short_burst", "--startup-timeout", "120",
         "--", "--model", "tiny", "--load-format", "dummy", "--device", "cpu",
         # one token per step, so that the step counts below are known (speculation, on by
         # default for a served backend, can take several per step)
         "--cpu-threads", "1", "--speculation", "off"], cwd=ROOT, capture_output=True, text=True,
        timeout=400,
        check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "a_short_burst.json").read_text())
    assert result["completed"] == 12 and result["num_errors"] == 0
    assert result["total_output_tokens"] == 12 * 8
    engine = result["engine"]
    # the backend's step log covers the workload: every output token came out of a logged step
    assert engine["num_steps"] >= 8 and engine["num_prefill_steps"] >= 1
    assert engine["busy_ms"] > 0 and 0 < engine["busy_fraction"] <= 1.0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["skipped"] == [] and summary["configs"]["a"]["num_logged_steps"] >= 8
    assert "| a | short_burst |" in (tmp_path / "serving_table.md").read_text()
    # a workload named twice runs twice, the second under its own name and window
    again = json.loads((tmp_path / "a_short_burst_2.json").read_text())
    assert again["completed"] == 12 and again["engine"]["num_steps"] >= 8
    assert again["config"]["seed"] != result["config"]["seed"]  # its own prompts
    rows = summary["rows"]
    assert [r["json"] for r in rows] == ["a_short_burst.json", "a_short_burst_2.json"]
    assert rows[0]["window_wall_s"][1] <= rows[1]["window_wall_s"][0]


def test_every_run_gets_its_own_prompts():
    """Each workload and each repeat draws its prompts from its own seed: with one seed, the
    400-burst's first 200 prompts were the 8 req/s run's and hit the server's prefix cache."""
    for suite in WORKLOADS.values():
        seeds = [run_seed(suite, w, k) for w in suite for k in (1, 2)]
        assert len(set(seeds)) == len(seeds)
