"""Discovery drives the pool's live add and drain (gateway.discovery): the endpoints file end to
end while serving, DNS records, and a Service's EndpointSlices read by the official Kubernetes
client from a fake API server."""
from __future__ import annotations

import asyncio
import os
import socket

import pytest
from aiohttp import web
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config, post

from gateway.app import create_app
from gateway.app_keys import GATEWAY_KEY
from gateway.backend_pool import PoolConfig
from gateway.discovery import (
    DiscoveryError,
    DnsName,
    EndpointsFile,
    KubernetesEndpointSlices,
    Membership,
    discovery_ctx,
    parse_endpoints,
)
from scheduler.placement import PlacementConfig


def test_parse_endpoints_lines_and_json():
    assert parse_endpoints("# backends\ntcp://10.0.0.1:5555\n\n ipc:///tmp/b.sock # two\n") == {
        "tcp://10.0.0.1:5555", "ipc:///tmp/b.sock"}
    assert parse_endpoints('["http://h:8000"]') == {"http://h:8000"}
    assert parse_endpoints('{"backends": ["tcp://h:1"]}') == {"tcp://h:1"}
    assert parse_endpoints("") == set()
    for bad in ("10.0.0.1:5555", "tcp://", '{"backends": "tcp://h:1"}', '["tcp://h:1"'):
        with pytest.raises(DiscoveryError):
            parse_endpoints(bad)


def write_atomic(path, addresses) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write("".join(a + "\n" for a in addresses))
    os.replace(tmp, path)  # what writers must do: readers never see half a file


async def test_endpoints_file_keeps_the_last_good_list(tmp_path):
    path = tmp_path / "backends"
    src = EndpointsFile(str(path))
    assert await src.read() is None  # no file yet: nothing known, nothing drained
    write_atomic(path, ["tcp://127.0.0.1:1"])
    assert await src.read() == {"tcp://127.0.0.1:1"}
    path.write_text("tcp://127.0.0.1:1\n127.0.0.1:2\n")  # a bad line: the file is not applied
    assert await src.read() is None
    write_atomic(path, [])
    assert await src.read() == set()


class FakePool:
    """Just the pool's membership calls."""

    class B:
        def __init__(self, address):
            self.address, self.draining = address, False

    def __init__(self, addresses=()):
        self.backends = [self.B(a) for a in addresses]

    def add_backend(self, address):
        if "bad" in address:
            raise RuntimeError("zmq.error.ZMQError: Invalid argument")  # as zmq's connect does
        self.backends.append(self.B(address))

    def drain_backend(self, address):
        next(b for b in self.backends if b.address == address).draining = True

    def leave(self, address):
        self.backends = [b for b in self.backends if b.address != address]


def test_membership_adds_drains_only_its_own_and_readds_after_leaving():
    pool = FakePool(["tcp://static:1"])
    m = Membership(pool)
    assert m.apply({"tcp://a:1", "tcp://b:1"}) == (["tcp://a:1", "tcp://b:1"], [])
    assert m.apply({"tcp://b:1"}) == ([], ["tcp://a:1"])
    assert m.apply({"tcp://b:1"}) == ([], [])  # draining already
    assert m.apply({"tcp://a:1", "tcp://b:1"}) == ([], [])  # still draining: not added twice
    pool.leave("tcp://a:1")
    assert m.apply({"tcp://a:1", "tcp://b:1"}) == (["tcp://a:1"], [])  # back once it has left
    assert m.apply(set()) == ([], ["tcp://a:1", "tcp://b:1"])
    # an address the pool refuses is skipped alone: the others still join
    assert m.apply({"tcp://bad", "tcp://c:1"}) == (["tcp://c:1"], [])
    assert not next(b for b in pool.backends if b.address == "tcp://static:1").draining


async def test_dns_records_become_addresses():
    records = [["10.1.0.5"], ["10.1.0.6", "fd00::7"]]

    async def resolve(host, port, type):
        assert (host, port, type) == ("backends.llm.svc", 5555, socket.SOCK_STREAM)
        ips = records[0]
        if not ips:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if ips == ["timeout"]:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (ip, port)) for ip in ips]

    src = DnsName("backends.llm.svc", 5555, resolve=resolve)
    assert await src.read() == {"tcp://10.1.0.5:5555"}
    records.pop(0)
    assert await src.read() == {"tcp://10.1.0.6:5555", "tcp://[fd00::7]:5555"}
    records[0] = ["timeout"]
    assert await src.read() is None  # a failed lookup keeps the last list
    records[0] = []
    assert await src.read() == set()  # no records: a headless service with no ready pod
    real = DnsName("localhost", 5555)  # the system resolver (no network: /etc/hosts)
    assert "tcp://127.0.0.1:5555" in await real.read()


def slice_json(name, port_name, port, endpoints):
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": "llm",
                         "labels": {"kubernetes.io/service-name": "tidegate-backend"}},
            "ports": [{"name": "metrics", "port": 8000, "protocol": "TCP"},
                      {"name": port_name, "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": cond} for ip, cond in endpoints]}


async def test_kubernetes_endpoint_slices_through_the_official_client(aiohttp_server):
    kubernetes = pytest.importorskip("kubernetes")
    slices = {"items": [
        slice_json("s1", "zmq", 5555, [("10.2.0.1", {"ready": True}),
                                       ("10.2.0.2", {"ready": False, "terminating": True}),
                                       ("10.2.0.3", {})]),  # no `ready`: ready (the API's rule)
        slice_json("s2", "zmq", 5555, [("10.2.0.4", {"ready": True})])]}
    seen = []

    async def list_slices(request):
        seen.append((request.match_info["ns"], request.query.get("labelSelector")))
        return web.json_response({"apiVersion": "discovery.k8s.io/v1",
                                  "kind": "EndpointSliceList", "metadata": {}, **slices})

    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", list_slices)
    server = await aiohttp_server(app)
    conf = kubernetes.client.Configuration(host=str(server.make_url("")).rstrip("/"))
    api = kubernetes.client.DiscoveryV1Api(kubernetes.client.ApiClient(conf))
    src = KubernetesEndpointSlices("llm", "tidegate-backend", "zmq", api=api)
    assert await src.read() == {"tcp://10.2.0.1:5555", "tcp://10.2.0.3:5555",
                                "tcp://10.2.0.4:5555"}
    assert seen == [("llm", "kubernetes.io/service-name=tidegate-backend")]
    slices["items"] = slices["items"][1:]
    assert await src.read() == {"tcp://10.2.0.4:5555"}
    await server.close()
    assert await src.read() is None  # the API server is away: keep the last list


# --- the endpoints file end to end, while serving ---------------------------------------------

async def test_endpoints_file_adds_and_drains_while_serving(aiohttp_client, tmp_path):
    """Backend B appears in the file mid-load and takes requests; then A leaves the file and is
    drained: its in-flight requests finish there, it takes no new ones, it leaves the pool.
    Every request gets exactly one complete answer."""
    a = await FakeBackend(ipc_address(), step_s=0.004, report_s=0.02).start()
    b = await FakeBackend(ipc_address(), step_s=0.004, report_s=0.02).start()
    path = tmp_path / "backends"
    write_atomic(path, [a.address])
    # least-tokens: requests spread by load (the default keeps sessions where they have slack)
    pool_cfg = PoolConfig(heartbeat_timeout_s=2.0, hello_interval_s=0.1,
                          placement=PlacementConfig(policy="least-tokens"))
    app = create_app(make_config(pool=pool_cfg), extra_cleanup_ctx=[
        discovery_ctx([EndpointsFile(str(path))], interval_s=0.05)])
    client = await aiohttp_client(app)
    pool = app[GATEWAY_KEY].pool
    try:
        assert [x.address for x in pool.backends] == [a.address]
        assert await pool.wait_ready(5.0)
        answers: list[tuple[int, dict]] = []
        stop = asyncio.Event()

        async def user(k):
            i = 0
            while not stop.is_set():
                answers.append(await post(client, "/v1/completions", {
                    "prompt": f"user {k} request {i}", "max_tokens": 12, "ignore_eos": True}))
                i += 1

        users = [asyncio.create_task(user(k)) for k in range(8)]
        await asyncio.sleep(0.3)
        write_atomic(path, [a.address, b.address])
        await until(lambda: len(b.received) >= 8)
        a.go.clear()  # A holds its requests in flight while it is drained
        await asyncio.sleep(0.05)
        num_on_a = len(a.received)
        held = len(a.running)
        write_atomic(path, [b.address])
        await until(lambda: pool.find(a.address) is not None and pool.find(a.address).draining)
        await asyncio.sleep(0.2)
        assert len(a.received) == num_on_a  # drained: nothing new goes there
        a.go.set()  # its in-flight requests finish where they are
        await until(lambda: pool.find(a.address) is None)
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*users)
    finally:
        await a.stop()
        await b.stop()
    assert held > 0
    assert [x.address for x in pool.backends] == [b.address]
    assert all(status == 200 for status, _ in answers), {s for s, _ in answers}
    assert all(body["choices"][0]["finish_reason"] == "length"
               and body["usage"]["completion_tokens"] == 12 for _, body in answers)
    # answered once each: as many answers as requests the backends took, no id twice
    ids = [body["id"] for _, body in answers]
    assert len(ids) == len(set(ids)) == len(a.received) + len(b.received)
    assert len(b.received) > 8


async def until(cond, timeout=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_serve_flags_make_sources():
    from gateway.discovery import sources_from_args
    from gateway.serve import build_parser

    args = build_parser().parse_args(["--endpoints-file", "/tmp/x", "--discover-dns",
                                      "svc.ns:5555", "--discover-k8s", "llm/tg:zmq"])
    names = [s.name for s in sources_from_args(args)]
    assert names == ["file /tmp/x", "dns svc.ns:5555", "k8s llm/tg"]
    with pytest.raises(SystemExit):
        sources_from_args(build_parser().parse_args(["--discover-dns", "nohost"]))

