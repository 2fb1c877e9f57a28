"""/tokenize, /detokenize, /version, /ping and who may read /metrics, against the fake backend."""
from __future__ import annotations

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config, post

from gateway.app import create_app


@pytest.fixture
async def backend():
    b = await FakeBackend(ipc_address()).start()
    yield b
    await b.stop()


@pytest.fixture
def client_of(aiohttp_client, backend):
    async def make(**kw):
        return await aiohttp_client(create_app(make_config(backend.address, **kw),
                                               startup_wait_s=5.0))
    return make


async def test_tokenize_text_and_chat_and_detokenize(client_of):
    client = await client_of()
    status, body = await post(client, "/tokenize", {"model": "tiny", "prompt": "hé"})
    assert status == 200, body
    assert body == {"count": 4, "max_model_len": 2048, "tokens": [256, *"hé".encode()],
                    "token_strs": None}
    _, body = await post(client, "/tokenize", {"prompt": "a", "add_special_tokens": False,
                                               "return_token_strs": True})
    assert body["tokens"] == [97] and body["token_strs"] == ["a"]
    # chat: rendered by the template; the template places BOS itself
    _, body = await post(client, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    text = "<|bos|><|user|>\nhi\n<|assistant|>\n"
    _, direct = await post(client, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert body["tokens"] == direct["tokens"] and body["tokens"][0] == 256
    # the ids are the ones a completion is given
    _, done = await post(client, "/v1/completions", {"prompt": "hé", "max_tokens": 1,
                                                     "return_token_ids": True})
    assert done["choices"][0]["prompt_token_ids"] == [256, *"hé".encode()]
    status, body = await post(client, "/detokenize", {"tokens": [256, 104, 105]})
    assert status == 200 and body == {"prompt": "<|bos|>hi"}


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": 3}, "prompt"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": ["a"]}, "tokens"),
    ("/detokenize", {"tokens": [99999]}, "tokens"),
])
async def test_tokenize_errors_are_400_naming_the_param(client_of, path, body, param):
    client = await client_of()
    status, got = await post(client, path, body)
    assert status == 400 and got["error"]["param"] == param
    status, got = await post(client, path, {**body, "model": "other"})
    assert status in (400, 404)


async def test_version_and_ping(client_of):
    client = await client_of()
    resp = await client.get("/version")
    assert resp.status == 200 and isinstance((await resp.json())["version"], str)
    for method in ("GET", "POST"):
        resp = await client.request(method, "/ping")
        assert resp.status == 200


async def test_metrics_open_with_an_api_key_unless_protected(client_of):
    client = await client_of(api_key="sekret")
    assert (await client.get("/metrics")).status == 200
    assert (await client.get("/version")).status == 200
    assert (await client.post("/tokenize", json={"prompt": "a"})).status == 401
    ok = await client.post("/tokenize", json={"prompt": "a"},
                           headers={"Authorization": "Bearer sekret"})
    assert ok.status == 200
    client = await client_of(api_key="sekret", protect_metrics=True)
    assert (await client.get("/metrics")).status == 401
    resp = await client.get("/metrics", headers={"Authorization": "Bearer sekret"})
    assert resp.status == 200
