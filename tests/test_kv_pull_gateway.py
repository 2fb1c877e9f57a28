"""Prefix pull through the gateway (issue 34): a request that spills over to a backend lacking its
prefix goes with the holder as its kv_source, the backend pulls the blocks, and the answer says
they were cached; with --kv-pull off the same request recomputes them. Two tiny backends in
threads of this process (tests.test_kv_pull.Backend), the real gateway app in front."""
from __future__ import annotations

import asyncio

import pytest
from test_gateway_http import make_config

from gateway.app import create_app
from gateway.app_keys import GATEWAY_KEY
from gateway.backend_pool import PoolConfig
from gateway.kv_pull import GatewayPulls
from proto import tidegate_pb2 as pb
from scheduler.kv_cost import KVRates, PullConfig
from scheduler.placement import PlacementConfig
from tests.test_kv_pull import Backend

PROMPT = "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n" * 8  # ~500 bytes


@pytest.fixture
def backends(tmp_path):
    bs = [Backend(tmp_path, f"b{k}") for k in range(2)]
    yield bs
    for b in bs:
        b.close()


async def _gateway(aiohttp_client, backends, pull: bool):
    cfg = PullConfig(min_tokens=16, default_rates=KVRates(prefill_tokens_per_s=1e3)) if pull else None
    pool = PoolConfig(heartbeat_timeout_s=5.0, hello_interval_s=0.1,
                      placement=PlacementConfig(policy="prefix"), kv_pull=cfg)
    app = create_app(make_config(*(b.worker.endpoint for b in backends), pool=pool),
                     startup_wait_s=10.0)
    client = await aiohttp_client(app)
    pool = app[GATEWAY_KEY].pool
    for _ in range(200):
        if len(pool.healthy_backends()) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(pool.healthy_backends()) == 2
    return client, pool


async def _complete(client, prompt: str) -> dict:
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                      "max_tokens": 4, "temperature": 0})
    assert resp.status == 200, await resp.text()
    return await resp.json()


@pytest.mark.parametrize("pull", [True, False])
async def test_a_spilled_request_pulls_its_prefix_from_the_holder(aiohttp_client, backends, pull):
    client, pool = await _gateway(aiohttp_client, backends, pull)
    first = await _complete(client, PROMPT + "# first\n")
    holder = next(b for b in pool.backends if b.address in
                  {x.worker.endpoint for x in backends if x.bm.num_cached_blocks})
    other = next(b for b in pool.backends if b is not holder)
    assert first["usage"]["prompt_tokens"] > 400
    # the holder looks busy: the next request of the prefix spills to the other backend
    pool.placement.charge(holder.pid, 10**7)
    second = await _complete(client, PROMPT + "# second\n")
    pool.placement.release(holder.pid, 10**7)
    receiver = next(x for x in backends if x.worker.endpoint == other.address)
    rep = receiver.report()
    cached = rep.num_cached_prompt_tokens  # the receiver's prefix-cache hits
    assert second["usage"]["prompt_tokens"] == rep.num_prompt_tokens
    if pull:
        assert rep.num_kv_pulls == 1 and rep.num_kv_pull_failures == 0
        assert cached >= 256 and rep.num_kv_pulled_tokens == cached
        assert pool.pulls.num_sent == 1
        # the gateway named the holder's KV socket: served off its step loop (kv_serve)
        served = next(x for x in backends if x.worker.endpoint == holder.address)
        assert served.worker.kv_server.num_served == 1 and served.worker.puller.num_served == 0
    else:
        assert rep.num_kv_pulls == 0 and cached == 0 and pool.pulls is None
    for b in backends:
        b.assert_no_leak()


def test_gateway_takes_rates_from_backend_info_and_reports():
    pulls = GatewayPulls(PullConfig())
    info = pb.BackendInfo(block_size=16, kv_layout="L", kv_block_bytes=16 * 2048)
    pulls.on_info(0, info)
    assert not pulls.planner.model(0).known()  # no prefill rate measured yet: never pulls
    pulls.on_report(0, pb.LoadReport(prefill_tokens_per_s=5e4, recent_step_time_ms=20,
                                     kv_pull_bytes_per_s=2e9, num_running=3))
    m = pulls.planner.model(0)
    assert m.known() and m.rates.bytes_per_token == 2048 and m.rates.link_bytes_per_s == 2e9
    assert pulls.peer_wait_s(0) == pytest.approx(0.02)
    pulls.on_info(1, pb.BackendInfo(block_size=16))  # an HTTP server or echo: no layout
    assert not pulls.planner.model(1).known()


def test_a_prefill_backend_with_no_measured_rate_is_split_to_at_the_decode_backends_rate():
    """A prefill-only backend measures its prefill rate only by prefilling, and it prefills only
    what is split to it: with its rate unknown the decode backend's stands in (same layout), so
    the first long Slow prompt is split; with neither known, nothing is."""
    from types import SimpleNamespace

    from gateway.kv_pull import split_prefills

    pulls = GatewayPulls(PullConfig(split_min_tokens=1024, split_margin=0.5))
    info = pb.BackendInfo(block_size=16, kv_layout="L", kv_block_bytes=16 * 2048)
    pulls.on_info(0, info)   # the prefill backend: no rate yet
    pulls.on_info(1, info)   # the decode backend

    def item():
        d = SimpleNamespace(prompt_ids=list(range(4096)), queue_class=pb.SLOW, kv_source=None,
                            request_id="r", priority=0, arrival_time=0.0)
        return SimpleNamespace(backend=1, payload=d)

    def dispatch(*a):
        return a
    prefill = [SimpleNamespace(pid=0, address="ipc:///tmp/p.sock")]
    assert split_prefills(pulls, [item()], prefill, dispatch) == []  # nothing measured yet
    pulls.on_report(1, pb.LoadReport(prefill_tokens_per_s=5e3, kv_pull_bytes_per_s=50e9))
    it = item()
    out = split_prefills(pulls, [it], prefill, dispatch)
    assert len(out) == 1 and out[0][0].pid == 0
    assert it.payload.kv_source.prefill_wait_s == pytest.approx(4096 / 5e3 + 2.0)
    assert pulls.queued_tokens(0) == 4096


async def test_disaggregated_slow_prefill(aiohttp_client, tmp_path):
    """A prefill-only backend takes the Slow request's prefill (its own copy, max_tokens 1, never
    seen by the client); the decode backend waits for it, pulls the KV and streams the answer.
    A Fast request of the same length stays on the decode backend, unsplit."""
    prefill = Backend(tmp_path, "prefill", role=pb.BackendInfo.PREFILL)
    decode = Backend(tmp_path, "decode")
    try:
        cfg = PullConfig(min_tokens=16, split_min_tokens=256, split_margin=1.0,
                         default_rates=KVRates(prefill_tokens_per_s=1e3))
        pool = PoolConfig(heartbeat_timeout_s=5.0, hello_interval_s=0.1,
                          placement=PlacementConfig(policy="prefix"), kv_pull=cfg)
        app = create_app(make_config(prefill.worker.endpoint, decode.worker.endpoint, pool=pool),
                         startup_wait_s=10.0)
        client = await aiohttp_client(app)
        gw_pool = app[GATEWAY_KEY].pool
        for _ in range(200):
            if len(gw_pool.healthy_backends()) == 2:
                break
            await asyncio.sleep(0.05)
        resp = await client.post("/v1/completions", json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": 80, "temperature": 0,
            "ignore_eos": True})
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert body["usage"]["completion_tokens"] == 80
        d, p = decode.report(), prefill.report()
        assert gw_pool.pulls.num_split == 1
        assert (d.num_kv_pulls, d.num_kv_pull_failures) == (1, 0)
        assert d.num_kv_pulled_tokens >= body["usage"]["prompt_tokens"] - 16
        assert p.num_kv_pulls_served == 1 and p.num_prompt_tokens == body["usage"]["prompt_tokens"]
        assert prefill.worker.kv_server.num_served == 1  # the wait ran on its KV thread
        # Fast: not split (the prefill backend sees nothing new)
        resp = await client.post("/v1/completions", json={
            "model": "tiny", "prompt": PROMPT + "# fast\n", "max_tokens": 4, "temperature": 0})
        assert resp.status == 200
        assert prefill.report().num_prompt_tokens == p.num_prompt_tokens
        assert gw_pool.pulls.queued_tokens(gw_pool.backends[0].pid) == 0
        for b in (prefill, decode):
            b.assert_no_leak()
    finally:
        prefill.close()
        decode.close()


def test_off_loop_backends_pay_no_step_for_a_pull():
    """The cost rule (scheduler.kv_cost): a peer that answers between its steps makes a pull wait
    for its step in progress, and a receiver that reads the reply between its own steps adds
    one of its own; off-loop backends (BackendInfo.kv_endpoint) add neither while the pull fits
    in the receiver's land wait."""
    from scheduler.kv_cost import KVCostModel
    on, off = (KVRates(bytes_per_token=2048, prefill_tokens_per_s=3000, link_bytes_per_s=1e8,
                       off_loop=x) for x in (True, False))
    cfg = PullConfig()
    assert KVCostModel(on, cfg).own_wait_s(1024, 0.5) == 0.0        # 2 MB at 100 MB/s: 21 ms
    assert KVCostModel(on, cfg).own_wait_s(4096, 0.5) == 0.5        # 84 ms: past the land wait
    assert KVCostModel(off, cfg).own_wait_s(1024, 0.5) == 0.5
    pulls = GatewayPulls(cfg)
    for pid, kv in ((0, "ipc:///x.kv"), (1, "")):
        pulls.on_info(pid, pb.BackendInfo(block_size=16, kv_layout="L", kv_block_bytes=16 * 2048,
                                          kv_endpoint=kv))
    assert pulls.rates(0).off_loop and not pulls.rates(1).off_loop
    assert pulls.endpoint(0, "ipc:///x") == "ipc:///x.kv"
    assert pulls.endpoint(1, "ipc:///y") == "ipc:///y"
    pulls.on_info(2, pb.BackendInfo(block_size=16, kv_layout="L", kv_block_bytes=16 * 2048,
                                    kv_endpoint="tcp://0.0.0.0:5601"))
    assert pulls.endpoint(2, "tcp://10.0.0.7:5600") == "tcp://10.0.0.7:5601"
