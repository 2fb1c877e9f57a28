"""Pareto-model fit: recovers known parameters, says when it fits badly, reads CSV and sweep JSON."""
import json

import numpy as np
import pytest

from sims.fit import fit_all, load_points, predict_spec


def _points(seed=0, noise=0.02):
    rng = np.random.default_rng(seed)
    L = np.geomspace(2.0, 3000.0, 40)
    T = predict_spec(L, 0.87, 0.62, 16, 4800) * np.exp(rng.normal(0.0, noise, L.size))
    return L, T


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_spec_parameters_within_2_percent(seed):
    L, T = _points(seed)
    out = fit_all(L, T, block_size=16, bandwidth_gbps=4800)
    assert out["alpha"] == pytest.approx(0.87, rel=0.02)
    assert out["beta"] == pytest.approx(0.62, rel=0.02)
    assert out["alpha_ci"][0] < 0.87 < out["alpha_ci"][1]
    assert out["beta_ci"][0] < 0.62 < out["beta_ci"][1]
    assert out["r2"] > 0.99 and "fits well" in out["verdict"]
    assert len(out["residuals_log"]) == 40


def test_says_plainly_when_the_model_fits_badly():
    L = np.geomspace(5, 2000, 30)
    T = 5000 * L / (L + 50)  # saturating throughput: not the spec's shape
    out = fit_all(L, T, 16, 4800)
    assert "BADLY" in out["verdict"] or "roughly" in out["verdict"]
    assert "saturating" in out["verdict"]
    best = min(out["alternatives"], key=lambda a: a["aic"])
    assert best["params"]["t_max"] == pytest.approx(5000, rel=1e-3)


def test_load_points_from_csv_and_sweep_json(tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text("latency_ms,throughput_tok_s\n10,100\n20,150\n40,180\n")
    L, T = load_points(csv)
    assert L.tolist() == [10, 20, 40] and T.tolist() == [100, 150, 180]
    js = tmp_path / "s.json"
    js.write_text(json.dumps({"points": [{"ttft_ms": {"p50": 5.0}, "output_throughput": 9.0}] * 3}))
    L, T = load_points(js)
    assert L.tolist() == [5.0] * 3
    with pytest.raises(ValueError):
        fit_all([1, 2], [1, 2], 16, 100)
