"""Admission through the HTTP gateway: a request predicted to miss its class's TTFT deadline is
refused at once (429, OpenAI error shape, Retry-After and retry-after-ms from the predicted wait)
and never reaches the backend; SLO attainment per class, headroom and the mean window in /metrics."""
from __future__ import annotations

import asyncio
import re

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config

from gateway.app import create_app
from scheduler.slo import SLOTargets

STEP_S = 0.02


class OneAtATime(FakeBackend):
    """Serves its requests one after another, each one step per token: a backend whose queue
    the gateway can see grow (the plain fake runs every request in every step)."""

    def _one_step(self) -> None:
        first = next(iter(self.running))
        rest = {k: v for k, v in self.running.items() if k != first}
        self.running = {first: self.running[first]}
        try:
            super()._one_step()
        finally:
            self.running.update(rest)


@pytest.fixture
async def slow_backend():
    b = await OneAtATime(ipc_address(), step_s=STEP_S).start()
    yield b
    await b.stop()


async def _complete(client, max_tokens=1, **extra):
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": max_tokens,
                                                      "ignore_eos": True, **extra})
    return resp.status, dict(resp.headers), await resp.json()


async def test_refused_at_once_with_the_predicted_wait(aiohttp_client, slow_backend):
    deadline_ms = 150
    app = create_app(make_config(slow_backend.address,
                                 slo=SLOTargets.parse(f"fast={deadline_ms}", None)),
                     startup_wait_s=5.0)
    client = await aiohttp_client(app)
    # warm-up: 16 at once, served one per step, teach the predictor the start gap (~20 ms)
    warm = await asyncio.gather(*[_complete(client) for _ in range(16)])
    assert all(s == 200 for s, _, _ in warm)  # nothing measured yet: all admitted
    received = len(slow_backend.received)
    burst = await asyncio.gather(*[_complete(client) for _ in range(30)])
    statuses = [s for s, _, _ in burst]
    ok, refused = statuses.count(200), [b for b in burst if b[0] == 429]
    # at ~20 ms a start, about 150 / 20 fit the deadline; the rest are refused
    assert 2 <= ok <= 15 and len(refused) == 30 - ok
    assert len(slow_backend.received) - received == ok  # a refused request never reached it
    for _, headers, body in refused:
        err = body["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "slo_unattainable"
        assert set(err) == {"message", "type", "param", "code"} and "fast" in err["message"]
        wait_ms = int(headers["retry-after-ms"])
        assert deadline_ms < wait_ms < 3000  # the predicted wait, past the deadline
        assert int(headers["Retry-After"]) == max(1, -(-wait_ms // 1000))
    # a request that brings its own, looser target is admitted into the same queue
    status, _, _ = await _complete(client, slo_ttft_ms=60_000)
    assert status == 200
    text = await (await client.get("/metrics")).text()
    n = float(re.search(r'tidegate_admission_refused_requests_total\{queue_class="fast"\} (\S+)',
                        text).group(1))
    assert n == len(refused)
    assert re.search(r'tidegate_slo_attainment_ratio\{queue_class="fast"\} ', text)
    assert re.search(r'tidegate_slo_headroom_requests_per_second\{backend="total"\} ', text)
    mean = float(re.search(r"^tidegate_window_size_mean (\S+)", text, re.MULTILINE).group(1))
    assert mean >= 1.0


async def test_no_ttft_target_admits_everything(aiohttp_client, slow_backend):
    app = create_app(make_config(slow_backend.address, slo=SLOTargets.parse(None, "1000")),
                     startup_wait_s=5.0)
    client = await aiohttp_client(app)
    await asyncio.gather(*[_complete(client) for _ in range(16)])
    burst = await asyncio.gather(*[_complete(client) for _ in range(30)])
    assert all(s == 200 for s, _, _ in burst)


async def test_attainment_per_class_counts_each_class_against_its_target(aiohttp_client):
    b = await FakeBackend(ipc_address(), step_s=0.01).start()
    try:
        # fast: TTFT 1 s (met); normal: TPOT 1 ms (missed at ~10 ms a token)
        app = create_app(make_config(b.address, slo=SLOTargets.parse("fast=1000", "normal=1")),
                         startup_wait_s=5.0)
        client = await aiohttp_client(app)
        for max_tokens in (4, 4, 20):  # two fast, one normal
            status, _, _ = await _complete(client, max_tokens=max_tokens)
            assert status == 200
        text = await (await client.get("/metrics")).text()
        def value(name, cls):
            return float(re.search(rf'{name}\{{queue_class="{cls}"\}} (\S+)', text).group(1))
        assert value("tidegate_slo_checked_requests_total", "fast") == 2
        assert value("tidegate_slo_attained_requests_total", "fast") == 2
        assert value("tidegate_slo_attainment_ratio", "fast") == 1.0
        assert value("tidegate_slo_attainment_ratio", "normal") == 0.0
    finally:
        await b.stop()


async def test_bad_slo_fields_are_400(aiohttp_client, slow_backend):
    app = create_app(make_config(slow_backend.address), startup_wait_s=5.0)
    client = await aiohttp_client(app)
    for bad in (0, -5, "fast", True, [1]):
        status, _, body = await _complete(client, slo_ttft_ms=bad)
        assert status == 400 and body["error"]["param"] == "slo_ttft_ms", (bad, body)


@pytest.mark.parametrize("report", [1, 0])
async def test_the_backends_reported_slots_predict_from_the_first_request(aiohttp_client, report):
    """Issue 31: a backend of one slot (BackendInfo.max_num_seqs = 1) runs a 40-token request
    (~0.8 s); a fast request sent now, before the gateway has ever seen a request wait there,
    is refused at once with the wait for that slot when the backend reported its slots, and
    admitted (to miss its 150 ms) when it did not: nothing to predict from but the bare start."""
    from gateway.app_keys import GATEWAY_KEY
    b = await OneAtATime(ipc_address(), step_s=STEP_S,
                         info_extra={"max_num_seqs": report} if report else {}).start()
    try:
        app = create_app(make_config(b.address, slo=SLOTargets.parse("fast=150", None),
                                     slot_model=True), startup_wait_s=5.0)
        client = await aiohttp_client(app)
        pred = app[GATEWAY_KEY].dispatcher.predictor
        assert pred._reported == ({0: 1} if report else {})
        status, _, _ = await _complete(client, max_tokens=3)  # measures the step (~20 ms)
        assert status == 200 and pred.backends[0].step > 0
        long = asyncio.create_task(_complete(client, max_tokens=40))
        for _ in range(200):  # until its first token
            await asyncio.sleep(0.005)
            if pred.backends[0].running:
                break
        assert pred.backends[0].running and pred.backends[0].seen_slots == 0
        status, headers, _ = await _complete(client, max_tokens=1)
        if report:
            assert status == 429 and 400 < int(headers["retry-after-ms"]) < 2000
        else:
            assert status == 200
        assert (await long)[0] == 200
    finally:
        await b.stop()
