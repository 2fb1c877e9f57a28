"""Tensor parallelism over two hosts (network namespaces, gloo over TCP): `tidegate backend
--tensor-parallel-size 2 --tp-nodes 2` on host 0 with the rendezvous, `--tp-node-rank 1` on host 1
— the shape of a LeaderWorkerSet group (deploy/). Greedy completions and their logprobs equal
those of the same two ranks on one host, and both hosts stop cleanly (exit 0) when host 0 does.
Skipped where network namespaces cannot be made (root)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from netns_hosts import Hosts, can_make_namespaces

ROOT = Path(__file__).resolve().parents[1]
HELPER = str(Path(__file__).with_name("netns_hosts.py"))
why_not = can_make_namespaces()
pytestmark = [pytest.mark.skipif(why_not is not None, reason=why_not or ""),
              pytest.mark.timeout(300), pytest.mark.slow]
PY = sys.executable
# scripts/gpu_multihost_run.sh sets cuda: host 0 on cuda:0, host 1 on cuda:1 (NCCL), the reference
# on cuda:0-1
DEVICE = os.environ.get("TIDEGATE_NETNS_TP_DEVICE", "cpu")
BODIES = [{"prompt": p, "max_tokens": 12, "temperature": 0, "logprobs": 1}
          for p in ("def f(", "import os\n", "class A:")]


def post(port: int, body: dict, prefix: list[str]) -> dict:
    code = ("import json, sys, urllib.request as u; r = u.urlopen(u.Request("
            f"'http://127.0.0.1:{port}/v1/completions', data=sys.stdin.read().encode(), "
            "headers={'Content-Type': 'application/json'}), timeout=120); print(r.read().decode())")
    out = subprocess.run([*prefix, PY, "-c", code], input=json.dumps(body), capture_output=True,
                         text=True, check=True, timeout=180)
    return json.loads(out.stdout)["choices"][0]


def serve(prefix: list[str], port: int, backend: str, env: dict) -> subprocess.Popen:
    p = subprocess.Popen([*prefix, PY, "-m", "gateway.tidegate_cli", "serve", "--port", str(port),
                          "--backend", backend], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    health = subprocess.run([*prefix, PY, HELPER, "health", f"http://127.0.0.1:{port}", "1",
                             "180"], cwd=ROOT, env=env, check=False, timeout=200)
    assert health.returncode == 0, "the backend never came up"
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(*procs: subprocess.Popen) -> list[int]:
    for p in procs:
        p.terminate()
    return [p.wait(60) for p in procs]


def test_two_hosts_serve_what_one_host_serves(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    common = ["--model", "tiny", "--tensor-parallel-size", "2", "--device", DEVICE]
    sock = f"ipc://{tmp_path}/backend.sock"

    # the reference: both ranks on this host (over loopback)
    backend = subprocess.Popen([PY, "-m", "gateway.tidegate_cli", "backend", "--listen", sock,
                                *common], cwd=ROOT, env=env)
    port = free_port()
    gateway = serve([], port, sock, env)
    reference = [post(port, b, []) for b in BODIES]
    assert stop(gateway, backend) == [0, 0]
    env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = "eth0"  # the link between hosts

    with Hosts(["h0", "h1"]) as hosts:
        multi = [*common, "--tp-nodes", "2", "--tp-rendezvous", f"{hosts.ip['h0']}:29500"]
        h1_device = ["--device", "cuda:1"] if DEVICE.startswith("cuda") else []  # its own GPU
        h1 = hosts.popen("h1", [PY, "-m", "gateway.tidegate_cli", "backend", *multi,
                                "--tp-node-rank", "1", *h1_device], cwd=ROOT, env=env)
        h0 = hosts.popen("h0", [PY, "-m", "gateway.tidegate_cli", "backend", "--listen", sock,
                                *multi], cwd=ROOT, env=env)
        in_h0 = ["ip", "netns", "exec", hosts.ns["h0"]]
        gateway = serve(in_h0, 18731, sock, env)
        got = [post(18731, b, in_h0) for b in BODIES]
        assert stop(gateway, h0) == [0, 0]
        assert h1.wait(60) == 0  # host 1's ranks leave when host 0 stops them
    for ref, out in zip(reference, got):
        assert out["text"] == ref["text"]
        assert out["logprobs"]["tokens"] == ref["logprobs"]["tokens"]
        assert out["logprobs"]["token_logprobs"] == ref["logprobs"]["token_logprobs"]
