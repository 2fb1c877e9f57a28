"""bench.simulator.fidelity_table (issue 35): a cell per grid load with each figure's interval,
bold only where the whole interval is inside the bound, and the mean window size beside it."""
from __future__ import annotations

import json
import math
from pathlib import Path

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
