"""bench.simulator.fidelity_table (issue 35): a cell per grid load with each figure's interval,
bold only where the whole interval is inside the bound, and the mean window size beside it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.simulator.fidelity_table import cell_names, cells, markdown

RES = Path(__file__).resolve().parents[1] / "bench" / "results"


def test_cells_of_the_committed_h200_run():
    doc = json.loads((RES / "fidelity_h200_2" / "validate_33b.json").read_text())
    assert cell_names(doc) == {"model": "33b", "weights": "bf16", "kv": "auto", "lengths": "512/128",
                               "runs": "5 x 45"}
    rows = cells(doc)
    assert [r["load"] for r in rows] == ["0.5x", "0.8x", "0.95x"]
    for r in rows:
        assert r["windows"] == (1.0, 1.0)  # one-request windows (the then default, 8,000 req/s)
        assert r["comparison"] == "replay_path"
        for f in r["figures"].values():
            assert f["inside"] == (abs(f["mean"]) + f["ci"] <= f["bound"])
    # the 0.95x TTFT P50 of the replay with the delivery path: -34.1% +- 7.1 (BENCHMARKS, issue 18)
    f = rows[2]["figures"]["ttft_p50"]
    assert round(100 * f["mean"], 1) == -34.1 and round(100 * f["ci"], 1) == 7.1 and not f["inside"]
    assert rows[0]["same_chunks"][0] == doc["loads"][0]["steps"]["same_prefill_step_share"]["mean"]


def test_markdown_bolds_only_cells_inside_with_their_interval():
    fig = {"mean": 0.02, "ci": 0.01, "bound": 0.05, "inside": True, "mean_inside": True}
    out = {"mean": 0.04, "ci": 0.02, "bound": 0.05, "inside": False, "mean_inside": True}
    row = {"model": "33b", "weights": "bf16", "kv": "auto", "lengths": "512/128", "sim_model": "async loop",
           "load": "0.8x", "runs": "3 x 200", "windows": (1.0, 1.25), "same_chunks": (0.97, math.nan),
           "figures": {"ttft_p50": fig, "ttft_p99": out, "tpot_p50": fig, "tpot_p99": fig, "throughput": fig}}
    line = markdown([row]).splitlines()[2]
    assert "| **+2.0 ± 1.0** | +4.0 ± 2.0 |" in line
    assert "| 1.00 / 1.25 | 97.0% | 3 x 200 |" in line
    # the same-chunks ceiling (validate_replay --ceiling) with its interval over the runs; one run: none
    line = markdown([{**row, "same_chunks_ceiling": 0.9, "same_chunks_ceiling_ci": 0.085}]).splitlines()[2]
    assert "| 97.0% (ceiling 90.0% ± 8.5) | 3 x 200 |" in line
    line = markdown([{**row, "same_chunks_ceiling": 0.9, "same_chunks_ceiling_ci": math.nan}]).splitlines()[2]
    assert "| 97.0% (ceiling 90.0%) | 3 x 200 |" in line


def _doc(seeds, errs, label="0.8x"):
    """A validate-shaped document: one load, one run per seed with the given TTFT P50 error."""
    def cmp_(e):
        return {m: {"live": 100.0, "sim": 100.0 * (1 + (e if m == "ttft_p50" else 0.0)),
                    "rel_err": e if m == "ttft_p50" else 0.0}
                for m in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "throughput", "itl_p50")}
    runs = [{"seed": s, "compare_replay_path": cmp_(e),
             "steps_path": {"same_prefill_step_share": 1.0 - e},
             "decisions": {"num_requests": [200, 200], "num_batches": [100, 100]}} for s, e in zip(seeds, errs)]
    return {"config": {"model": "deepseek-coder-33b", "input_len": 512, "output_len": 128, "num_requests": 200,
                       "seeds": ",".join(map(str, seeds)), "confidence": 0.95},
            "profile": {"dtype": "bfloat16", "model_terms": {}, "async_plan_lead_ms": 1.9},
            "loads": [{"load_label": label, "runs": runs}]}


def test_pool_and_seeds_recompute_each_cell_from_its_runs():
    from bench.simulator.fidelity_stats import mean_ci
    from bench.simulator.fidelity_table import pool, resummarize

    a, b = _doc([0, 1, 2], [0.01, 0.02, 0.03]), _doc([3, 4], [-0.05, -0.07])
    (cell,) = cells(pool([a, b]))
    want = mean_ci([0.01, 0.02, 0.03, -0.05, -0.07])
    assert cell["figures"]["ttft_p50"]["mean"] == pytest.approx(want["mean"])
    assert cell["figures"]["ttft_p50"]["ci"] == pytest.approx(want["ci"])
    assert cell["runs"] == "5 x 200" and cell["windows"] == (2.0, 2.0)
    assert cell["same_chunks"][0] == pytest.approx(1 - want["mean"])
    (only,) = cells(resummarize(a, seeds={1, 2}))
    assert only["figures"]["ttft_p50"]["mean"] == pytest.approx(0.025) and only["runs"] == "2 x 200"


def test_the_delivery_paths_per_stream_cost_names_the_simulator():
    from bench.simulator.fidelity_table import resummarize
    doc = _doc([0, 1], [0.0, 0.01])
    doc["delivery_path"] = {"base_ms": 1.55, "per_stream_ms": 0.0726}
    (cell,) = cells(resummarize(doc))
    assert "path 1.55 + 0.073 ms/stream" in cell["sim_model"]
