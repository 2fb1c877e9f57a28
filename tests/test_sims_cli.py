"""CLI smoke tests: every `tidegate sim` command runs and writes valid JSON."""
import json

import numpy as np
import pytest

from sims.cli import main
from sims.fit import predict_spec

SMALL = ["--model", "deepseek-coder-1.3b", "--num-requests", "150", "--output-len", "uniform:1:64",
         "--input-len", "uniform:16:256"]


def test_run_writes_the_report_keys(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", *SMALL, "--gpu", "h200", "--backends", "2", "--rate", "50", "--seed", "3",
                 "--slo-ttft-ms", "50", "--slo-tpot-ms", "10", "--json", str(out),
                 "--plot", str(tmp_path / "plots")]) == 0
    rep = json.loads(out.read_text())
    for key in ("request_throughput", "output_throughput", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert key in rep
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(rep[key]) == {"mean", "p50", "p90", "p99"}
    assert rep["completed"] == 150 and 0 <= rep["goodput"] <= rep["request_throughput"]
    assert set(rep["by_class"]) <= {"fast", "normal", "slow"} and rep["by_class"]
    for key in ("batch_size", "steps", "kv", "preemptions"):
        assert key in rep
    assert rep["config"]["backends"] == 2
    assert "TTFT" in capsys.readouterr().out
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {"latency_cdf.png", "queue_kv.svg"}


def test_run_reads_a_toml_config_and_flags_win(tmp_path):
    cfg = tmp_path / "sim.toml"
    cfg.write_text('model = "deepseek-coder-1.3b"\n[workload]\nrate = 5\nnum-requests = 40\n'
                   '[batcher]\nmin-latency-ms = 2.0\nno-idle-flush = true\n')
    out = tmp_path / "r.json"
    assert main(["run", "--config", str(cfg), "--num-requests", "30", "--json", str(out)]) == 0
    c = json.loads(out.read_text())["config"]
    assert (c["rate"], c["num_requests"], c["min_latency_ms"], c["idle_flush"]) == (5, 30, 2.0, False)
    bad = tmp_path / "bad.toml"
    bad.write_text("no_such_option = 1\n")
    with pytest.raises(SystemExit):
        main(["run", "--config", str(bad)])


def test_sweep_then_fit_round_trip(tmp_path, capsys):
    js, csv = tmp_path / "sweep.json", tmp_path / "sweep.csv"
    assert main(["sweep", *SMALL, "--backends", "1", "--rates", "5,40,400", "--jobs", "2",
                 "--json", str(js), "--csv", str(csv), "--plot", str(tmp_path / "p")]) == 0
    doc = json.loads(js.read_text())
    assert len(doc["points"]) == 3 and any(p["pareto"] for p in doc["points"])
    assert csv.read_text().startswith("latency_ms,throughput_tok_s,")
    assert (tmp_path / "p" / "latency_throughput.svg").exists()
    capsys.readouterr()
    assert main(["fit", str(csv), "--block-size", "16", "--bandwidth-gbps", "4280", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    for key in ("alpha", "beta", "alpha_ci", "beta_ci", "r2", "verdict", "alternatives"):
        assert key in fit
    assert main(["fit", str(js), "--block-size", "16", "--bandwidth-gbps", "4280"]) == 0
    assert "verdict" in capsys.readouterr().out


def test_fit_cli_recovers_known_parameters(tmp_path, capsys):
    rng = np.random.default_rng(0)
    L = np.geomspace(2, 3000, 40)
    T = predict_spec(L, 0.87, 0.62, 16, 4800) * np.exp(rng.normal(0, 0.02, L.size))
    path = tmp_path / "pts.csv"
    path.write_text("latency_ms,throughput_tok_s\n" + "".join(f"{a},{b}\n" for a, b in zip(L, T)))
    out = tmp_path / "fit.json"
    assert main(["fit", str(path), "--block-size", "16", "--bandwidth-gbps", "4800", "--json", str(out)]) == 0
    fit = json.loads(out.read_text())
    assert fit["alpha"] == pytest.approx(0.87, rel=0.02) and fit["beta"] == pytest.approx(0.62, rel=0.02)
    assert main(["fit", str(tmp_path / "missing.csv"), "--block-size", "16",
                 "--bandwidth-gbps", "1"]) == 2


def test_search_writes_best_and_window_comparison(tmp_path, capsys):
    out = tmp_path / "search.json"
    assert main(["search", *SMALL, "--rate", "100", "--backends-grid", "1,2",
                 "--max-batch-size-grid", "128", "--min-latency-ms-grid", "0,5",
                 "--idle-flush-grid", "on", "--slo-ttft-ms", "100", "--slo-tpot-ms", "20",
                 "--jobs", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["candidates"]) == 4
    assert doc["best"]["goodput_per_gpu"] == max(c["goodput_per_gpu"] for c in doc["candidates"]
                                                 if c["meets_p99_slo"])
    assert doc["window_vs_no_window"]["no_window"]["min_latency_ms"] == 0
    with pytest.raises(SystemExit):
        main(["search", *SMALL])  # no SLO


def test_plan_33b_on_1_to_8_h200(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "deepseek-coder-33b", "--gpu", "h200", "--gpus", "1-8",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["num_gpus"] for r in doc["results"]] == list(range(1, 9))
    r8 = doc["results"][7]
    assert r8["best_latency"]["tp"] == 8  # all-reduces over NVLink beat pipeline bubbles
    assert r8["best_throughput"]["throughput_tok_s"] >= doc["results"][0]["best_throughput"]["throughput_tok_s"]
    # 56 heads: tp=3 cannot split them
    three = next(p for p in doc["results"][2]["plans"] if p["tp"] == 3)
    assert not three["fits"] and "heads" in three["reason"]


def test_plan_rejects_what_does_not_fit(capsys):
    from sims.hardware import get_gpu
    from sims.model_shape import load_model_shape
    from sims.plan import PlanConfig, evaluate
    a100 = get_gpu("a100")
    shape = load_model_shape("deepseek-coder-33b")
    assert not evaluate(shape, a100, 1, 1, 1, PlanConfig(batch=64, context_len=4096)).fits
    assert evaluate(shape, a100, 4, 4, 1, PlanConfig(batch=64, context_len=4096)).fits


def test_unknown_command_and_bad_model(capsys):
    assert main(["nope"]) == 2
    assert main(["run", "--model", "no-such-model", "--num-requests", "5"]) == 2
    assert main([]) == 0


def test_prefix_caching_flag_defaults_to_auto_and_validate_forces_on(tmp_path):
    import argparse

    from bench.simulator.validate import sim_spec
    from sims.options import add_run_args, parse_with_config, spec_from_args

    def spec(*argv):
        p = argparse.ArgumentParser()
        add_run_args(p)
        return spec_from_args(parse_with_config(p, list(argv))).scheduler.enable_prefix_caching

    assert spec() is None  # auto: on only when the workload shares prefixes
    assert spec("--prefix-caching", "on") is True
    assert spec("--prefix-caching", "off") is False
    assert spec("--no-prefix-caching") is False
    cfg = tmp_path / "c.toml"
    cfg.write_text("no-prefix-caching = true\n")
    assert spec("--config", str(cfg)) is False
    cfg.write_text("prefix-caching = \"on\"\n")
    assert spec("--config", str(cfg)) is True
    # the live comparison keeps caching on, as the live engine does
    s = sim_spec(tmp_path / "p.json", 64, 16, 256, 8, 256, None, None, 4, 1.0, 16, 4, 0)
    assert s.scheduler.enable_prefix_caching is True
