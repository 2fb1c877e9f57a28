"""`tidegate bench`: serve end to end against a fake OpenAI server in a thread; engine forwarding."""
from __future__ import annotations

import asyncio
import json
import sys
import threading
import types
from contextlib import contextmanager

import pytest
from aiohttp import web
from test_bench_loadgen import RATE_LIMITED, FakeOpenAI

from bench.cli import main

LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


@contextmanager
def serve_in_thread(app: web.Application):
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    started = threading.Event()
    port = []

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port.append(runner.addresses[0][1])
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(5)
    try:
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_serve_end_to_end_json_and_table(tmp_path, capsys):
    fake = FakeOpenAI(first_delay=0.02, gap=0.002)
    out = tmp_path / "r.json"
    with serve_in_thread(fake.app()) as url:
        rc = main(["serve", "--url", url, "--num-requests", "12", "--rate", "300", "--seed", "3",
                   "--input-len", "4", "--output-len", "uniform:2:80", "--slo-ttft-ms", "500",
                   "--goodput", "tpot:50", "--max-concurrency", "8", "--json", str(out),
                   "--detailed", "--no-progress"])
    assert rc == 0
    table = capsys.readouterr().out
    for text in ("Serving Benchmark Result", "Successful requests:", "Mean TTFT (ms):",
                 "P99 ITL (ms):", "Request goodput (req/s):", "By class"):
        assert text in table
    r = json.loads(out.read_text())
    for key in ("request_throughput", "output_throughput", "goodput", "by_class", "num_errors",
                "duration_s", *LATENCY_KEYS):
        assert key in r
    for key in LATENCY_KEYS:
        assert set(r[key]) == {"mean", "p50", "p90", "p99"}
    assert r["num_errors"] == 0 and r["completed"] == 12 and r["model"] == "fake-model"
    assert r["slo"] == {"ttft_ms": 500, "tpot_ms": 50}
    assert r["config"]["rate"] == 300 and r["config"]["max_concurrency"] == 8
    assert len(r["requests"]) == 12 and all(x["ttft_s"] > 0 for x in r["requests"])
    assert sum(c["num_requests"] for c in r["by_class"].values()) == 12
    assert [b["max_tokens"] for b in fake.bodies] != [fake.bodies[0]["max_tokens"]] * 12
    assert all(len(b["prompt"]) == 4 for b in fake.bodies)


@contextmanager
def fake_backend_in_thread(**kw):
    from test_gateway_fakes import FakeBackend
    from test_gateway_http import ipc_address

    loop = asyncio.new_event_loop()
    started = threading.Event()
    backend = []

    def run():
        asyncio.set_event_loop(loop)
        backend.append(loop.run_until_complete(FakeBackend(ipc_address(), **kw).start()))
        started.set()
        loop.run_forever()
        loop.run_until_complete(backend[0].stop())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(5)
    try:
        yield backend[0].address
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_serve_zmq_backend(tmp_path, capsys):
    pytest.importorskip("gateway.client")
    out = tmp_path / "z.json"
    # the fake backend speaks the protocol the gateway's ZMQ front door speaks to clients
    with fake_backend_in_thread(step_s=0.003) as address:
        rc = main(["serve", "--backend", "zmq", "--zmq-url", address, "--num-requests", "5",
                   "--input-len", "3", "--output-len", "6", "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["backend"] == "zmq" and r["model"] == "tiny"
    assert r["completed"] == 5 and r["total_output_tokens"] == 30
    assert r["itl_ms"]["p50"] > 0
    from test_gateway_http import ipc_address
    assert main(["serve", "--backend", "zmq", "--zmq-url", ipc_address(), "--timeout", "0.3",
                 "--num-requests", "1"]) == 1
    assert "RequestTimeout" in capsys.readouterr().err


def test_serve_from_a_trace_with_errors(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_time": 0.01 * i, "prompt_tokens": 3 + i,
                                         "output_tokens": [4, RATE_LIMITED, 6][i % 3]}) + "\n"
                             for i in range(6)))
    fake = FakeOpenAI(first_delay=0.005, gap=0.001)
    out = tmp_path / "r.json"
    with serve_in_thread(fake.app()) as url:
        rc = main(["serve", "--url", url, "--trace", str(trace), "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["num_requests"] == 6 and r["num_errors"] == 2 and r["errors"] == {"http_429": 2}
    assert sorted(len(b["prompt"]) for b in fake.bodies) == [3, 4, 5, 6, 7, 8]
    assert "http_429 2" in capsys.readouterr().out


def test_serve_unreachable_and_bad_args(unused_tcp_port, capsys):
    assert main(["serve", "--url", f"http://127.0.0.1:{unused_tcp_port}", "--num-requests",
                 "1"]) == 1
    assert "tidegate bench serve:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--input-len", "normal:3"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["serve", "--goodput", "e2el:100"])
    with pytest.raises(SystemExit):
        main(["serve", "--rate", "0"])


def test_usage_and_dispatch_from_tidegate(capsys):
    from gateway.tidegate_cli import main as tidegate
    assert main([]) == 0 and "serve" in capsys.readouterr().out
    assert main(["nope"]) == 2
    assert tidegate(["bench", "--help"]) == 0
    assert "engine" in capsys.readouterr().out


def test_engine_forwards_args_or_says_it_is_missing(monkeypatch, capsys):
    seen = []
    fake = types.ModuleType("bench.engine.steps")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "bench.engine.steps", fake)
    assert main(["engine", "--model", "tiny", "--batch", "8"]) == 0
    assert seen == [["--model", "tiny", "--batch", "8"]]
    monkeypatch.setitem(sys.modules, "bench.engine.steps", None)      # import fails as if missing
    assert main(["engine"]) == 3
    assert "not built yet" in capsys.readouterr().err


def test_bench_imports_neither_backend_nor_torch():
    """bench may import sims (shared metrics and workloads), never backend or torch."""
    import subprocess
    code = ("import sys, bench.cli, bench.serving.loadgen, sims.metrics, bench.serving.report, sims.workload; "
            "bad = [m for m in ('backend', 'torch', 'gateway.core') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
