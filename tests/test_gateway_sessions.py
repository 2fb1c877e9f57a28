"""Agent sessions through the gateway (issue 30): a session key from OpenAI's prompt_cache_key,
a coding agent's session header or Anthropic's metadata keeps a session's turns on one backend
while new sessions spread; pins from cache_control (Anthropic, with its ttl; tidegate's field on
OpenAI requests) and the ZMQ client reach the backend, and the answer says what became of them;
/metrics shows sessions and pins; a bad cache_control is a 400."""
from __future__ import annotations

import asyncio

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config, post

from gateway.app import create_app
from gateway.app_keys import GATEWAY_KEY
from gateway.backend_pool import PoolConfig
from gateway.client import AsyncClient
from gateway.frontdoor import frontdoor_ctx
from proto import tidegate_pb2 as pb
from scheduler.placement import PlacementConfig

SYSTEM = "You are a coding agent. Use the tools; keep answers short. " * 4


class PinningBackend(FakeBackend):
    """Records each request's session key and pin; answers a pin with PINNED and reports a
    few cached prompt tokens, as our engine does."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.requests: list[pb.GenerateRequest] = []
        self._told: set[str] = set()

    def _admit(self, peer, r, prompt) -> None:
        self.requests.append(r)
        super()._admit(peer, r, prompt)

    def _send(self, peer, env, arrays=()) -> None:
        if env.HasField("step_output"):
            for o in env.step_output.outputs:
                if o.request_id not in self._told:
                    self._told.add(o.request_id)
                    o.num_cached_tokens = 5
                    req = next(r for r in self.requests if r.request_id == o.request_id)
                    if req.pin_ttl_s > 0:
                        o.pin_status = pb.RequestOutput.PINNED
        super()._send(peer, env, arrays)


@pytest.fixture
async def backends():
    bs = [await PinningBackend(ipc_address()).start() for _ in range(2)]
    yield bs
    for b in bs:
        await b.stop()


async def _gateway(aiohttp_client, backends, door):
    pool = PoolConfig(heartbeat_timeout_s=2.0, hello_interval_s=0.1,
                      placement=PlacementConfig(policy="prefix"))
    app = create_app(make_config(*(b.address for b in backends), pool=pool), startup_wait_s=5.0,
                     extra_cleanup_ctx=[frontdoor_ctx(door)])
    client = await aiohttp_client(app)
    pool = app[GATEWAY_KEY].pool
    for _ in range(200):
        if len(pool.healthy_backends()) == 2:
            break
        await asyncio.sleep(0.05)
    return client


async def test_session_headers_keep_turns_together_and_spread_sessions(aiohttp_client, backends):
    client = await _gateway(aiohttp_client, backends, ipc_address())
    history = {"a": "", "b": ""}
    placed: dict[str, list[int]] = {"a": [], "b": []}
    for turn in range(4):
        for s, how in (("a", "header"), ("b", "key")):
            history[s] += f" turn {turn} of session {s}: read file {turn * 7}."
            body = {"model": "tiny", "max_tokens": 3,
                    "messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": history[s]}]}
            kw = {}
            if how == "header":
                kw["headers"] = {"X-Claude-Code-Session-Id": "sess-a"}
            else:
                body["prompt_cache_key"] = "sess-b"
            n = [len(b.requests) for b in backends]
            status, out = await post(client, "/v1/chat/completions", body, **kw)
            assert status == 200, out
            placed[s].append(next(k for k, b in enumerate(backends) if len(b.requests) > n[k]))
            assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}
    assert len(set(placed["a"])) == 1 and len(set(placed["b"])) == 1, placed
    assert placed["a"][0] != placed["b"][0]          # two sessions, two backends
    text = await (await client.get("/metrics")).text()
    assert 'tidegate_session_requests{outcome="stayed"} 6.0' in text
    assert 'tidegate_session_requests{outcome="moved"} 0.0' in text


async def test_pins_through_openai_anthropic_and_zmq(aiohttp_client, backends):
    door = ipc_address()
    client = await _gateway(aiohttp_client, backends, door)
    status, out = await post(client, "/v1/completions", {
        "model": "tiny", "prompt": SYSTEM + "write a test", "max_tokens": 3,
        "cache_control": {"type": "ephemeral", "ttl": "10m"}})
    assert status == 200, out
    assert out["usage"]["pin"] == "pinned"
    req = next(r for b in backends for r in b.requests if r.pin_ttl_s)
    assert (req.pin_ttl_s, req.pin_tokens) == (600, 0)            # the whole prompt
    body = {"model": "tiny", "max_tokens": 3,
            "system": [{"type": "text", "text": SYSTEM,
                        "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "messages": [{"role": "user", "content": "now fix the bug in parse()"}]}
    status, out = await post(client, "/v1/messages", body)
    assert status == 200, out
    assert out["usage"]["pin"] == "pinned" and out["usage"]["cache_read_input_tokens"] == 5
    req = next(r for b in backends for r in b.requests if r.pin_ttl_s == 3600)
    num_prompt = out["usage"]["input_tokens"] + out["usage"]["cache_read_input_tokens"] + \
        out["usage"]["cache_creation_input_tokens"]
    assert req.pin_ttl_s == 3600 and 0 < req.pin_tokens < num_prompt   # up to the system block
    async with AsyncClient(door) as zc:
        got = await zc.generate(SYSTEM + "zmq", max_tokens=3, session_key="z1", pin_ttl_s=60.0)
    assert got.pin == "pinned" and got.num_cached_tokens == 5
    assert sum(r.pin_ttl_s == 60 for b in backends for r in b.requests) == 1
    text = await (await client.get("/metrics")).text()
    assert 'tidegate_pin_requests_total{outcome="pinned"} 3.0' in text


@pytest.mark.parametrize("cc", [{"type": "ephemeral", "ttl": "2d"}, {"type": "persistent"},
                                "5m", {"ttl": "5m", "extra": 1}])
async def test_bad_cache_control_is_a_400_in_each_shape(aiohttp_client, backends, cc):
    client = await _gateway(aiohttp_client, backends, ipc_address())
    status, out = await post(client, "/v1/completions", {"model": "tiny", "prompt": "x",
                                                         "max_tokens": 2, "cache_control": cc})
    assert status == 400 and out["error"]["param"].startswith("cache_control"), out
    status, out = await post(client, "/v1/messages", {
        "model": "tiny", "max_tokens": 2,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x",
                                                   "cache_control": cc}]}]})
    assert status == 400 and out["type"] == "error", out
