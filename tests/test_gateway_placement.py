"""Placement in the gateway: the pool splits a window over backends with the policy objects of
scheduler.placement; same-prefix requests follow each other, loads come back to zero, a
backend's reported prefix facts steer requests to it."""
from __future__ import annotations

import asyncio

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config

from gateway.app import create_app
from gateway.app_keys import GATEWAY_KEY
from gateway.backend_pool import PoolConfig
from scheduler.placement import PlacementConfig, prefix_hashes

TENANT_A = "You are tenant A's assistant. Answer briefly and in French, always. " * 2
TENANT_B = "Tenant B here: you review Rust code for memory safety and style bugs. " * 2


@pytest.fixture
async def two_backends():
    bs = [await FakeBackend(ipc_address()).start() for _ in range(2)]
    yield bs
    for b in bs:
        await b.stop()


async def _client(aiohttp_client, backends, policy: str):
    pool = PoolConfig(heartbeat_timeout_s=2.0, hello_interval_s=0.1,
                      placement=PlacementConfig(policy=policy))
    app = create_app(make_config(*(b.address for b in backends), pool=pool), startup_wait_s=5.0)
    client = await aiohttp_client(app)
    pool = app[GATEWAY_KEY].pool
    for _ in range(200):                 # both backends introduced
        if len(pool.healthy_backends()) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(pool.healthy_backends()) == 2
    return client, pool


async def _complete(client, prompt: str, i: int):
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": f"{prompt} q{i}",
                                                      "max_tokens": 4})
    assert resp.status == 200, await resp.text()
    return await resp.json()


def _where(backends, n_before):
    return [b.received[n_before[k]:] for k, b in enumerate(backends)]


async def test_prefix_affinity_keeps_each_tenant_on_one_backend(aiohttp_client, two_backends):
    client, _ = await _client(aiohttp_client, two_backends, "prefix")
    for b in two_backends:
        b.go.clear()                     # hold the steps: every request stays in flight
    jobs = []
    for i in range(3):
        jobs.append(asyncio.create_task(_complete(client, TENANT_A, i)))
        await asyncio.sleep(0.05)
        jobs.append(asyncio.create_task(_complete(client, TENANT_B, i)))
        await asyncio.sleep(0.05)
    for _ in range(100):
        if sum(len(b.received) for b in two_backends) == 6:
            break
        await asyncio.sleep(0.02)
    counts = [len(b.received) for b in two_backends]
    for b in two_backends:
        b.go.set()
    await asyncio.gather(*jobs)
    assert counts == [3, 3]              # A's three on one backend, B's three on the other
    metrics = await (await client.get("/metrics")).text()
    assert 'tidegate_backend_outstanding_tokens' in metrics
    for line in metrics.splitlines():    # every charged token was released
        if line.startswith("tidegate_backend_outstanding_tokens{"):
            assert float(line.rsplit(" ", 1)[1]) == 0.0, line


async def test_least_tokens_alternates_the_same_requests(aiohttp_client, two_backends):
    client, _ = await _client(aiohttp_client, two_backends, "least-tokens")
    for b in two_backends:
        b.go.clear()
    jobs = []
    for i in range(4):
        jobs.append(asyncio.create_task(_complete(client, TENANT_A, i)))
        await asyncio.sleep(0.05)
    for _ in range(100):
        if sum(len(b.received) for b in two_backends) == 4:
            break
        await asyncio.sleep(0.02)
    counts = [len(b.received) for b in two_backends]
    for b in two_backends:
        b.go.set()
    await asyncio.gather(*jobs)
    assert counts == [2, 2]


async def test_reported_prefix_facts_steer_placement(aiohttp_client, two_backends):
    ids = [(7 * i) % 250 + 1 for i in range(80)]        # a token-id prompt: 4 full blocks of 16
    # the second backend says it holds this prefix (e.g. another gateway sent it there)
    two_backends[1].prefix_hashes = list(prefix_hashes(ids, 16))
    client, _ = await _client(aiohttp_client, two_backends, "prefix")
    await asyncio.sleep(0.2)                             # a few LoadReports
    for i in range(3):
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": ids + [i + 1],
                                                          "max_tokens": 2})
        assert resp.status == 200, await resp.text()
    assert len(two_backends[0].received) == 0 and len(two_backends[1].received) == 3
