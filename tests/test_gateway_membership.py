"""Membership while serving (/admin/backends): add a backend and it takes requests, drain one
and it takes none while its last request finishes, then leaves; remove one; each visible in
/metrics; the endpoint needs its own key."""
from __future__ import annotations

import asyncio

from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config

from gateway.app import create_app
from gateway.app_keys import GATEWAY_KEY
from gateway.backend_pool import PoolConfig
from scheduler.placement import PlacementConfig

ADMIN = {"Authorization": "Bearer s3cret"}


async def _wait(cond, timeout=5.0):
    for _ in range(int(timeout / 0.05)):
        if cond():
            return True
        await asyncio.sleep(0.05)
    return cond()


async def test_add_drain_remove_while_serving(aiohttp_client):
    a = await FakeBackend(ipc_address()).start()
    b = await FakeBackend(ipc_address()).start()
    try:
        pool_cfg = PoolConfig(heartbeat_timeout_s=2.0, hello_interval_s=0.1,
                              placement=PlacementConfig(policy="least-tokens"))
        app = create_app(make_config(a.address, pool=pool_cfg, api_key="client-key",
                                     admin_key="s3cret"), startup_wait_s=5.0)
        client = await aiohttp_client(app)
        pool = app[GATEWAY_KEY].pool
        # the admin endpoint wants the admin key, not the clients'
        r = await client.get("/admin/backends", headers={"Authorization": "Bearer client-key"})
        assert r.status == 401
        r = await client.post("/admin/backends", json={"action": "add", "address": b.address},
                              headers=ADMIN)
        assert r.status == 200, await r.text()
        assert await _wait(lambda: len(pool.healthy_backends()) == 2)
        r = await client.post("/admin/backends", json={"action": "add", "address": b.address},
                              headers=ADMIN)
        assert r.status == 409
        # both take requests now
        a.go.clear()
        b.go.clear()
        auth = {"Authorization": "Bearer client-key"}
        jobs = [asyncio.create_task(client.post("/v1/completions", headers=auth,
                                                json={"prompt": f"x{i}", "max_tokens": 3}))
                for i in range(4)]
        assert await _wait(lambda: len(a.received) + len(b.received) == 4)
        assert len(a.received) == 2 and len(b.received) == 2
        # drain b: its two requests finish there, new ones go to a, then b leaves
        r = await client.post("/admin/backends", json={"action": "drain", "address": b.address},
                              headers=ADMIN)
        assert r.status == 200
        metrics = await (await client.get("/metrics", headers=auth)).text()
        assert f'tidegate_backend_draining{{backend="{b.address}"}} 1.0' in metrics
        more = [asyncio.create_task(client.post("/v1/completions", headers=auth,
                                                json={"prompt": f"y{i}", "max_tokens": 3}))
                for i in range(2)]
        assert await _wait(lambda: len(a.received) == 4)
        assert len(b.received) == 2
        a.go.set()
        b.go.set()
        for resp in await asyncio.gather(*jobs, *more):
            assert resp.status == 200
        assert await _wait(lambda: pool.find(b.address) is None)
        metrics = await (await client.get("/metrics", headers=auth)).text()
        assert not [ln for ln in metrics.splitlines()
                    if ln.startswith("tidegate_backend_") and b.address in ln]
        # remove a (the last one): the pool is empty, requests get 503
        r = await client.post("/admin/backends", json={"action": "remove", "address": a.address},
                              headers=ADMIN)
        assert r.status == 200 and (await r.json())["backends"] == []
        r = await client.post("/v1/completions", headers=auth, json={"prompt": "z", "max_tokens": 2})
        assert r.status == 503
        r = await client.post("/admin/backends", json={"action": "drain", "address": a.address},
                              headers=ADMIN)
        assert r.status == 404
        r = await client.post("/admin/backends", json={"action": "nap", "address": a.address},
                              headers=ADMIN)
        assert r.status == 400
    finally:
        await a.stop()
        await b.stop()


async def test_no_admin_key_no_admin_endpoint(aiohttp_client):
    a = await FakeBackend(ipc_address()).start()
    try:
        app = create_app(make_config(a.address), startup_wait_s=5.0)
        client = await aiohttp_client(app)
        r = await client.get("/admin/backends")
        assert r.status == 404
    finally:
        await a.stop()
