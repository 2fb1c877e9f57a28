"""bench.serving.rate_knee: the SLO control's capacity as the rate where TTFT starts to grow
(issue 31, fifteenth session), read off a short sweep instead of a rate-inf burst."""
from __future__ import annotations

import json

from bench.serving.rate_knee import knee, main


def test_the_last_rate_before_ttft_doubles():
    # the simulated 33B H200 sweep (s13 profile, prefill cap 256, seed 11): p90 313 ms at 6
    rows = [(6, 313.0), (8, 406.0), (10, 473.0), (12, 500.0), (14, 576.0), (15, 803.0), (16, 932.0)]
    assert knee(rows) == (14, False)
    assert knee(rows[:5]) == (14, True)        # every rate passed: the sweep goes on
    assert knee(list(reversed(rows))) == (14, False)  # order of the rows does not matter
    assert knee([]) == (None, True)


def test_slack_keeps_a_fast_backend_from_failing_on_noise():
    assert knee([(10, 5.0), (20, 30.0)]) == (20, True)       # 30 < 2 x 5 + 50
    assert knee([(10, 5.0), (20, 30.0)], slack_ms=0.0) == (10, False)


def test_the_command_reads_bench_serve_json(tmp_path, capsys):
    files = []
    for k, (rate, p90) in enumerate([(5.0, 300.0), (7.5, 420.0), (10.0, 900.0)]):
        path = tmp_path / f"sweep_{k}.json"
        path.write_text(json.dumps({"config": {"rate": rate}, "ttft_ms": {"p90": p90},
                                    "request_throughput": rate}))
        files.append(str(path))
    assert main(files) == 0
    assert float(capsys.readouterr().out) == 7.5
    assert main(["--next", *files[:2]]) == 0
    assert main(["--next", *files]) == 1


def test_the_gpu_script_sweeps_and_runs_our_engine_fast_first():
    from pathlib import Path
    script = (Path(__file__).resolve().parents[1] / "scripts" / "gpu_slo_run.sh").read_text()
    assert "bench.serving.rate_knee" in script and "--waiting-by-class" in script
    assert "--num-requests \"$N\" --rate inf" not in script  # no burst of N for capacity
