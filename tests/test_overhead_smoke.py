"""`tidegate bench overhead` end to end with tiny counts: the JSON it writes and sane numbers."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(60)
def test_overhead_bench_smoke(tmp_path):
    out_path = tmp_path / "overhead.json"
    cmd = [sys.executable, "-m", "gateway.tidegate_cli", "bench", "overhead", "--duration", "0.4",
           "--warmup", "0.05", "--requests", "150", "--concurrency", "1", "8",
           "--json", str(out_path)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=55,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "http_gateway" in proc.stdout and "goal zmq_client_p99_ms_at_c1" in proc.stdout

    out = json.loads(out_path.read_text())
    assert out["format"] == "tidegate-overhead/1" and out["output_tokens"] == 1
    assert len(out["machine"]["loadavg_start"]) == 3 and out["machine"]["cpu_count"] >= 1
    res = out["results"]
    assert set(res) == {"http_gateway", "bare_aiohttp", "zmq_client", "raw_zmq"}
    for path, by_c in res.items():
        assert set(by_c) == {"1", "8"}, path
        for c, r in by_c.items():
            lat = r["latency_ms"]
            assert r["errors"] == 0, (path, c, r.get("error_sample"))
            assert 0 < r["requests"] <= 150, (path, c)
            values = [r["requests_per_s"], *lat.values(), *r["cpu_us_per_request"].values()]
            assert all(math.isfinite(v) and v >= 0 for v in values), (path, c, r)
            assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"], (path, c, lat)
            if path in ("http_gateway", "zmq_client"):
                assert set(r["cpu_us_per_request"]) == {"gateway", "backend", "client"}
                assert {"p50", "p99", "mean"} <= set(r["added_latency_ms"])
                assert math.isfinite(r["rate_vs_baseline"]) and r["rate_vs_baseline"] > 0
    # the raw ping-pong is the floor of the full ZMQ path; a bare handler that of the gateway
    for c in ("1", "8"):
        assert res["raw_zmq"][c]["latency_ms"]["p50"] < res["zmq_client"][c]["latency_ms"]["p50"]
        assert res["bare_aiohttp"][c]["latency_ms"]["p50"] < \
            res["http_gateway"][c]["latency_ms"]["p50"]
    assert res["raw_zmq"]["1"]["requests_per_s"] > res["zmq_client"]["1"]["requests_per_s"]
    goals = out["goals"]
    assert {"zmq_client_p99_ms_at_c1", "http_rate_vs_bare_at_c1", "http_rate_vs_bare_at_c8"} \
        <= set(goals)
    assert all(isinstance(g["met"], bool) and math.isfinite(g["value"]) for g in goals.values())
