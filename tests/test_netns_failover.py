"""Many hosts on one machine: the gateway and two backends in separate network namespaces over
TCP with CURVE, found through the endpoints file. One backend host is killed (every process in its
namespace, SIGKILL) while 64 streams run: every request gets exactly one terminal answer — its
finish, or an error event for a stream that had tokens on the dead host — and none is lost or
answered twice (here: 32 finished on the survivor, 32 failed with an error event, each a stream
with tokens on the dead host). Then the surviving backend is drained through the file while 16
streams run on it: all 16 finish there. Skipped where network namespaces cannot be made (root)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns_hosts import Hosts, can_make_namespaces

from proto.security import generate

ROOT = Path(__file__).resolve().parents[1]
HELPER = str(Path(__file__).with_name("netns_hosts.py"))
why_not = can_make_namespaces()
pytestmark = [pytest.mark.skipif(why_not is not None, reason=why_not or ""),
              pytest.mark.timeout(240), pytest.mark.slow]
URL = "http://127.0.0.1:8000"


def write_atomic(path: Path, lines: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)


def wait_line(proc, prefix: str, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
        assert time.monotonic() < deadline, f"no {prefix!r} line"
    raise AssertionError(f"exited ({proc.wait()}) before printing {prefix!r}")


def outcomes(client) -> list[dict]:
    out, _ = client.communicate(timeout=180)
    return json.loads(out.strip().splitlines()[-1])


def test_kill_a_backend_host_mid_stream_then_drain_the_other(tmp_path):
    py = sys.executable
    keys = tmp_path / "keys"
    generate(keys, "gateway")
    generate(keys, "backend")
    allow = keys / "allow"
    allow.mkdir()
    (allow / "gateway.key").write_text((keys / "gateway.key").read_text())
    endpoints = tmp_path / "backends"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with Hosts(["gw", "b1", "b2"]) as hosts:
        addr = {h: f"tcp://{hosts.ip[h]}:5555" for h in ("b1", "b2")}
        backends = {h: hosts.popen(h, [
            py, "-m", "gateway.tidegate_cli", "backend", "--listen", addr[h], "--model", "tiny",
            "--cpu-threads", "1", "--backend-id", h,
            "--curve-key", str(keys / "backend.key_secret"), "--curve-allow", str(allow)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
            for h in ("b1", "b2")}
        for p in backends.values():
            wait_line(p, "tidegate backend ready")
        write_atomic(endpoints, [addr["b1"], addr["b2"]])
        gateway = hosts.popen("gw", [
            py, "-m", "gateway.tidegate_cli", "serve", "--host", "127.0.0.1", "--port", "8000",
            "--endpoints-file", str(endpoints), "--discovery-interval", "0.2",
            "--heartbeat-timeout", "2", "--placement", "least-tokens",
            "--curve-key", str(keys / "gateway.key_secret"),
            "--backend-key", str(keys / "backend.key")],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        wait_line(gateway, "tidegate serving")
        health = hosts.popen("gw", [py, HELPER, "health", URL, "2", "60"], cwd=ROOT, env=env)
        assert health.wait(90) == 0, "the gateway never saw both backends"

        # phase 1: 64 streams over both hosts; b1's host dies once all have tokens
        client = hosts.popen("gw", [py, HELPER, "client", URL, "64", "64", "300"], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, text=True)
        wait_line(client, "STARTED 64")
        assert hosts.kill("b1")
        results = outcomes(client)
        assert len(results) == 64 and sorted(r["i"] for r in results) == list(range(64))
        for r in results:
            answers = len(r["finishes"]) + len(r["errors"])
            assert r["status"] == 200 and answers == 1, r  # exactly one terminal answer
            assert r["done"] == 1, r
            if r["finishes"]:
                assert r["finishes"] == ["length"] and r["completion_tokens"] == 300, r
        num_failed = sum(1 for r in results if r["errors"])
        assert 0 < num_failed < 64  # b1's streams that had tokens fail; the rest finish on b2

        # phase 2: the survivor is drained while it streams; all of its requests finish there
        client = hosts.popen("gw", [py, HELPER, "client", URL, "16", "16", "200"], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, text=True)
        wait_line(client, "STARTED 16")
        write_atomic(endpoints, [])
        results = outcomes(client)
        assert all(r["finishes"] == ["length"] and r["completion_tokens"] == 200 and not r["errors"]
                   for r in results), results
        assert backends["b2"].poll() is None  # drained, not killed
        print(f"phase 1: {64 - num_failed} finished, {num_failed} failed with an error event "
              "(streams with tokens on the killed host); phase 2: 16/16 finished while draining")
