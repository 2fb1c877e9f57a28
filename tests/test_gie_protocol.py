"""A one-backend tidegate meets the Gateway API Inference Extension's model-server protocol
(kubernetes-sigs/gateway-api-inference-extension, docs/proposals/003-model-server-protocol):

- OpenAI Completions and Chat;
- on /metrics, gauges for TotalQueuedRequests, TotalRunningRequests and KVCacheUtilization, and
  `cache_config_info`'s `block_size` / `num_gpu_blocks` labels, read the way GIE's endpoint picker
  reads them: the family named by its flag, the FIRST series whose labels contain the flag's
  labels (`pkg/epp/backend/metrics`: getLatestMetric, no timestamps in the exposition), the
  gauge's value; block size and block count parsed as integers from the labels.
"""
from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config, post

from gateway.app import create_app
from gateway.backend_pool import PoolConfig
from gateway.gie_metrics import EPP_METRIC_FLAGS, pod_totals
from gateway.vllm_metrics import EngineReport


def epp_spec(flag: str) -> tuple[str, dict[str, str]]:
    """`name` or `name{a=b,c=d}`, as the EPP parses its metric flags (stringToMetricSpec)."""
    if "{" not in flag:
        return flag.strip(), {}
    name, _, rest = flag.partition("{")
    pairs = [p.split("=") for p in rest.rstrip("}").split(",")]
    return name.strip(), {k.strip(): v.strip() for k, v in pairs}


def epp_read(exposition: str, flag: str):
    """The sample the EPP takes for one metric flag, or None (it logs an error and goes on)."""
    name, labels = epp_spec(flag)
    for fam in text_string_to_metric_families(exposition):
        if fam.name != name:
            continue
        assert fam.type == "gauge", (name, fam.type)  # the protocol's type for all of them
        for s in fam.samples:
            if all(s.labels.get(k) == v for k, v in labels.items()):
                return s
    return None


class EppView:
    """What GIE's endpoint picker knows about one pod after a scrape (MetricsState)."""

    def __init__(self, exposition: str, flags=EPP_METRIC_FLAGS) -> None:
        q = epp_read(exposition, flags["total-queued-requests-metric"])
        r = epp_read(exposition, flags["total-running-requests-metric"])
        kv = epp_read(exposition, flags["kv-cache-usage-percentage-metric"])
        info = epp_read(exposition, flags["cache-info-metric"])
        self.waiting_queue_size = int(q.value)
        self.running_requests_size = int(r.value)
        self.kv_cache_usage_percent = kv.value
        self.block_size = int(info.labels["block_size"]) if info else None
        self.num_blocks = int(info.labels["num_gpu_blocks"]) if info else None


def report(engine, *, running=0, waiting=0, usage=0.0, blocks=1000, block_size=16, healthy=True):
    return EngineReport(engine=engine, healthy=healthy, num_running=running,
                        num_waiting=waiting, kv_cache_usage=usage, block_size=block_size,
                        num_blocks=blocks)


def test_pod_totals_sum_queues_and_weight_kv_by_capacity():
    a = report("a", running=4, waiting=2, usage=0.5, blocks=1000)
    b = report("b", running=1, waiting=1, usage=0.1, blocks=3000)
    down = report("c", running=9, waiting=9, usage=1.0, blocks=5000, healthy=False)
    t = pod_totals([a, b, down], gateway_waiting=5, accepting=["a", "b"])
    assert (t.num_waiting, t.num_running) == (5 + 2 + 1, 4 + 1)
    assert t.kv_cache_usage == pytest.approx((500 + 300) / 4000)
    assert (t.block_size, t.num_gpu_blocks) == (16, 4000)
    assert t.headroom == 0.0  # requests wait: no headroom whatever the free blocks
    t = pod_totals([a, b], gateway_waiting=0, accepting=["b"])  # a drains: its blocks are not room
    assert t.num_waiting == 3 and t.headroom == 0.0 and t.load_backends == 1.0
    t = pod_totals([report("a", usage=0.25), report("b", usage=0.75)], 0, accepting=["a"])
    assert t.headroom == pytest.approx(0.75) and t.kv_cache_usage == pytest.approx(0.5)
    assert t.load_backends == pytest.approx(0.25)  # one backend takes work, a quarter used
    # backends that disagree on the block size: no block size rather than a wrong one
    t = pod_totals([report("a"), report("b", block_size=32)], 0, accepting=["a", "b"])
    assert (t.block_size, t.num_gpu_blocks) == (0, 0)
    assert pod_totals([], 0).headroom == 0.0


@pytest.fixture
async def paused_backend():
    b = await FakeBackend(ipc_address(), report_s=0.02, num_total_blocks=1000).start()
    yield b
    await b.stop()


async def scrape(client) -> str:
    resp = await client.get("/metrics")
    assert resp.status == 200
    return await resp.text()


async def eventually(client, check, timeout=3.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        view = EppView(await scrape(client))
        if check(view) or asyncio.get_running_loop().time() > deadline:
            return view
        await asyncio.sleep(0.03)


async def test_one_backend_tidegate_as_gie_reads_it(aiohttp_client, paused_backend):
    b = paused_backend
    pool = PoolConfig(heartbeat_timeout_s=1.0, hello_interval_s=0.1, max_inflight_per_backend=2)
    client = await aiohttp_client(create_app(make_config(b.address, pool=pool),
                                             startup_wait_s=5.0))
    # the inference API: completions and chat
    status, body = await post(client, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert status == 200 and body["object"] == "text_completion"
    status, body = await post(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert status == 200 and body["object"] == "chat.completion"
    idle = await eventually(client, lambda v: v.running_requests_size == 0)
    assert (idle.waiting_queue_size, idle.running_requests_size) == (0, 0)
    assert (idle.block_size, idle.num_blocks) == (16, 1000)

    b.go.clear()  # the backend stops stepping: 2 requests run there (the cap), 3 wait here
    def send():
        return asyncio.create_task(post(client, "/v1/completions",
                                        {"prompt": "hello", "max_tokens": 30}))
    tasks = [send(), send()]
    await eventually(client, lambda v: v.running_requests_size == 2)
    tasks += [send() for _ in range(3)]
    busy = await eventually(client, lambda v: (v.waiting_queue_size, v.running_requests_size)
                            == (3, 2))
    assert (busy.waiting_queue_size, busy.running_requests_size) == (3, 2)
    used = 1000 - b.num_free_blocks
    assert used > 0 and busy.kv_cache_usage_percent == pytest.approx(used / 1000, abs=1e-9)
    text = await scrape(client)
    # one series per pod for each protocol gauge: the first one is the total
    for flag in EPP_METRIC_FLAGS.values():
        if flag:
            name = epp_spec(flag)[0]
            fam = next(f for f in text_string_to_metric_families(text) if f.name == name)
            assert len(fam.samples) == 1, (name, fam.samples)
    assert epp_read(text, "tidegate:headroom_ratio").value == 0.0  # requests wait
    assert epp_read(text, "tidegate:load_backends").value == 1.0  # demand: the whole backend
    b.go.set()
    results = await asyncio.gather(*tasks)
    assert [s for s, _ in results] == [200] * 5
    done = await eventually(client, lambda v: v.running_requests_size == 0
                            and v.kv_cache_usage_percent == 0.0)
    assert (done.waiting_queue_size, done.running_requests_size) == (0, 0)
    assert done.kv_cache_usage_percent == 0.0
    assert epp_read(await scrape(client), "tidegate:headroom_ratio").value == 1.0


def test_epp_spec_parsing_matches_the_flag_syntax():
    assert epp_spec("vllm:num_requests_waiting") == ("vllm:num_requests_waiting", {})
    assert epp_spec("m{a=b, c=d}") == ("m", {"a": "b", "c": "d"})
