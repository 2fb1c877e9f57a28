"""Fuzz the HTTP API (issue 13): random and mutated JSON bodies against every endpoint, from a
property-based generator (hypothesis) that knows our fields. Zero 5xx, every error in the
OpenAI shape, and the service healthy afterwards with every KV block back in the pool.

CI runs FUZZ_HTTP_BODIES (default 1,000) bodies; `scripts/fuzz_long.sh` runs 10,000.
"""
from __future__ import annotations

import asyncio
import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config

from gateway.app import create_app
from gateway.backend_pool import PoolConfig
from gateway.validation import CHAT_FIELDS, COMPLETION_FIELDS

NUM_BODIES = int(os.environ.get("FUZZ_HTTP_BODIES", "1000"))
CONCURRENCY = 16
# every route of gateway.app (plus a wrong method and an unknown path); the first four take
# bodies with the completions (0, 2) or chat (1, 3) fields
ROUTES = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("POST", "/tokenize"),
          ("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/v1/models"),
          ("GET", "/health"), ("GET", "/ping"), ("POST", "/ping"), ("GET", "/version"),
          ("GET", "/metrics"), ("POST", "/v1/models"), ("GET", "/nope")]
CHAT_ROUTES = (1, 3)

surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
texts = st.one_of(st.text(max_size=12), st.text(alphabet=surrogate, min_size=1, max_size=2),
                  st.sampled_from(["", "def f(x):", "\x00", "ü€😀", "a" * 300]))
ints = st.one_of(st.integers(-3, 70), st.integers(), st.sampled_from(
    [2**31, 2**31 - 1, -(2**31) - 1, 2**32, 2**63, -(2**63) - 1, 2**64, 10**400]))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-3, 3))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)), max_leaves=8)
token_lists = st.lists(ints, min_size=0, max_size=6)
messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool",
                                                    "bogus"]),
                           "content": st.one_of(texts, json_values, st.lists(
                               st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                               max_size=2))}),
    json_values), max_size=3)

FIELD_VALUES = {
    "prompt": st.one_of(texts, token_lists, st.lists(texts, max_size=3),
                        st.lists(token_lists, max_size=3), json_values),
    "tokens": st.one_of(token_lists, json_values),  # /detokenize
    "messages": messages,
    "stop": st.one_of(texts, st.lists(texts, max_size=20), json_values),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}),
                                json_values),
    "logit_bias": st.one_of(st.dictionaries(st.sampled_from(["1", "2", "x", "-1", "99999"]),
                                            floats, max_size=3), json_values),
}
VALUES = st.one_of(ints, floats, st.booleans(), texts, st.none(), json_values)


@st.composite
def bodies(draw):
    route = draw(st.sampled_from(range(len(ROUTES))))
    chat = route in CHAT_ROUTES
    fields = sorted(CHAT_FIELDS if chat else COMPLETION_FIELDS | {"tokens"})
    names = draw(st.lists(st.sampled_from(fields), max_size=8, unique=True))
    body = {"prompt": "hi", "max_tokens": 4} if not chat else {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    if draw(st.booleans()):
        body = {}
    for name in names:
        body[name] = draw(FIELD_VALUES.get(name, VALUES))
    body.update(draw(st.dictionaries(texts, json_values, max_size=2)))
    raw = json.dumps(body, ensure_ascii=draw(st.booleans()), allow_nan=True).encode("utf-8",
                                                                                    "surrogatepass")
    mutation = draw(st.sampled_from(["none", "none", "flip", "cut", "insert", "wrap"]))
    if mutation == "flip" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([draw(st.integers(0, 255))]) + raw[i + 1:]
    elif mutation == "cut":
        raw = raw[:draw(st.integers(0, len(raw)))]
    elif mutation == "insert":
        i = draw(st.integers(0, len(raw)))
        raw = raw[:i] + draw(st.binary(max_size=4)) + raw[i:]
    elif mutation == "wrap":
        raw = json.dumps([json.loads(raw)] if draw(st.booleans()) else "x").encode()
    return route, raw


def generate(n: int) -> list[tuple[int, bytes]]:
    """n examples from the hypothesis strategy (generation only; each is checked below)."""
    out: list[tuple[int, bytes]] = []

    @seed(int(os.environ.get("FUZZ_SEED", "13")))
    @settings(max_examples=n, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(bodies())
    def collect(example):
        out.append(example)

    collect()
    return out


@pytest.fixture
async def backend():
    # short context and fast steps: a valid fuzzed request costs at most ~64 cheap tokens
    b = await FakeBackend(ipc_address(), max_model_len=64, step_s=0.0005).start()
    yield b
    await b.stop()


async def test_fuzzed_bodies_never_get_a_5xx(aiohttp_client, backend):
    # The fake backend shares this event loop: under 16 concurrent requests on a busy machine
    # its heartbeat can come late, and a backend marked down makes 502/503s that are about the
    # test's loop, not about input. The fuzz is about input, so the heartbeat window is wide.
    pool = PoolConfig(heartbeat_timeout_s=60.0, hello_interval_s=0.1)
    client = await aiohttp_client(create_app(make_config(backend.address, pool=pool,
                                                         request_timeout_s=60.0),
                                             startup_wait_s=5.0))
    examples = generate(NUM_BODIES)
    rng = random.Random(13)
    statuses: dict[int, int] = {}
    failures = []

    async def one(route: int, raw: bytes) -> None:
        method, path = ROUTES[route]
        headers = {"Content-Type": rng.choice(["application/json", "text/plain", ""])}
        resp = await client.request(method, path, data=raw, headers=headers)
        body = await resp.read()
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        if resp.status >= 500 or b'"server_error"' in body:
            failures.append((path, raw[:300], resp.status, body[:300]))
        elif resp.status >= 400:
            err = json.loads(body)["error"]
            assert set(err) == {"message", "type", "param", "code"}, body

    sem = asyncio.Semaphore(CONCURRENCY)

    async def bounded(ex):
        async with sem:
            await one(*ex)

    await asyncio.gather(*(bounded(ex) for ex in examples))
    print(f"\nfuzzed {len(examples)} bodies; statuses {dict(sorted(statuses.items()))}")
    for failure in failures[:5]:
        print("5xx:", failure)
    assert len(examples) >= NUM_BODIES * 0.95  # hypothesis may stop early on a tiny space
    assert not failures, failures[:5]
    # healthy afterwards, and every fake KV block is back
    resp = await client.get("/health")
    assert resp.status == 200
    resp = await client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 3})
    assert resp.status == 200
    for _ in range(200):
        if not backend.running:
            break
        await asyncio.sleep(0.02)
    assert not backend.running and backend.num_free_blocks == backend.num_total_blocks
