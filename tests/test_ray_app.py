"""tidegate on a local Ray instance (CPU): the gateway as a Serve application, backends as Serve
replicas found through the registry; scaling the backends adds one live and drains one, and every
request is answered. Skipped without Ray (`pip install 'tidegate[ray]'`)."""
from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port: int, path: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def healthy_backends(port: int) -> int:
    _, text = call(port, "/metrics")
    return sum(1 for line in text.splitlines()
               if line.startswith("tidegate_backend_healthy{") and line.endswith(" 1.0"))


def wait_for(cond, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_serve():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage report leaves the machine
    ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False,
             logging_level="warning")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()


def test_gateway_as_a_serve_app_with_backends_as_replicas(ray_serve):
    from gateway.ray_app import build_app, make_curve_keys

    port = ray_serve
    keys = make_curve_keys()  # the same keys: re-running the app only rescales the backends

    def app(n):
        return build_app(model="tiny", num_backends=n, drain_s=2.0, keys=keys,
                         bind_host="127.0.0.1", serve_args=["--placement", "least-tokens"])

    serve.run(app(1), name="tidegate", route_prefix="/")
    wait_for(lambda: healthy_backends(port) == 1)
    status, body = call(port, "/v1/completions", {"prompt": "def f", "max_tokens": 6,
                                                  "ignore_eos": True})
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 6
    status, body = call(port, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True})
    events = [ln[len("data: "):] for ln in body.splitlines() if ln.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]" and len(events) >= 3

    serve.run(app(2), name="tidegate", route_prefix="/")  # a second backend joins live
    wait_for(lambda: healthy_backends(port) == 2)
    answers = [call(port, "/v1/completions", {"prompt": f"x{i}", "max_tokens": 4,
                                              "ignore_eos": True}) for i in range(8)]
    assert all(s == 200 for s, _ in answers), answers

    serve.run(app(1), name="tidegate", route_prefix="/")  # one is drained and leaves
    wait_for(lambda: healthy_backends(port) == 1)
    status, body = call(port, "/v1/completions", {"prompt": "def g", "max_tokens": 3})
    assert status == 200, body
