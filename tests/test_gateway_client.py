"""The ZMQ front door and the client library, against a live gateway with the fake backend."""
from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio
from test_gateway_fakes import DEFAULT_TEXT, FakeBackend
from test_gateway_http import ipc_address, make_config
from test_gateway_limits import wait_for

from gateway.app import create_app
from gateway.client import (
    AsyncClient,
    Client,
    InvalidRequestError,
    RequestTimeout,
)
from gateway.frontdoor import FRONTDOOR_KEY, frontdoor_ctx
from proto import codec
from proto import tidegate_pb2 as pb


@pytest.fixture
async def backend():
    b = await FakeBackend(ipc_address()).start()
    yield b
    await b.stop()


@pytest.fixture
def door_address():
    return ipc_address()


async def start_gateway(aiohttp_client, backend, door_address, **kw):
    app = create_app(make_config(backend.address, **kw), startup_wait_s=5.0,
                     extra_cleanup_ctx=[frontdoor_ctx(door_address)])
    return await aiohttp_client(app)


@pytest.fixture
async def gateway(aiohttp_client, backend, door_address):
    return await start_gateway(aiohttp_client, backend, door_address)


async def test_async_generate_and_stream(gateway, door_address):
    async with AsyncClient(door_address) as client:
        assert client.model == "tiny" and client.info.max_model_len == 2048
        result = await client.generate("hi", max_tokens=100)
        assert result.text == DEFAULT_TEXT and result.finish_reason == "stop"
        assert result.num_prompt_tokens == 3 and result.num_completion_tokens == \
            len(DEFAULT_TEXT.encode()) + 1
        deltas = [d async for d in client.stream([1, 2, 3], max_tokens=10)]
        assert "".join(d.text for d in deltas) == DEFAULT_TEXT.encode()[:10].decode()
        assert deltas[-1].finish_reason == "length"
        assert all("\ufffd" not in d.text for d in deltas)
        result = await client.generate("x", max_tokens=100, stop=["wörld"])
        assert result.text == "Hello, " and result.finish_reason == "stop"


async def test_concurrent_async_requests(gateway, door_address, backend):
    async with AsyncClient(door_address) as client:
        results = await asyncio.gather(*(client.generate(f"p{i}", max_tokens=5)
                                         for i in range(50)))
    assert all(r.text == "Hello" and r.finish_reason == "length" for r in results)
    assert len(backend.received) == 50


async def test_closing_a_stream_aborts_on_the_backend(gateway, door_address, backend):
    start = backend.num_free_blocks
    async with AsyncClient(door_address) as client:
        agen = client.stream("hi", max_tokens=500, ignore_eos=True)
        async for _ in agen:
            break
        await agen.aclose()
        await wait_for(lambda: len(backend.aborted) == 1)
    assert backend.num_free_blocks == start and not backend.running


async def test_typed_errors_and_timeout(gateway, door_address, backend):
    async with AsyncClient(door_address, timeout=0.3) as client:
        with pytest.raises(InvalidRequestError) as info:
            await client.generate("hi", max_tokens=0)
        assert info.value.code == "INVALID_REQUEST"
        with pytest.raises(InvalidRequestError, match="2048"):
            await client.generate("hi", max_tokens=5000)
        backend.go.clear()
        with pytest.raises(RequestTimeout):
            await client.generate("hi", max_tokens=5)
        await wait_for(lambda: len(backend.aborted) == 1)
        backend.go.set()


async def test_sync_client(gateway, door_address, backend):
    def work():
        with Client(door_address) as client:
            result = client.generate("hi", max_tokens=100)
            it = client.stream("hi", max_tokens=500, ignore_eos=True)
            first = next(it)
            it.close()
            return result, first

    result, first = await asyncio.to_thread(work)
    assert result.text == DEFAULT_TEXT
    assert first.token_ids
    await wait_for(lambda: len(backend.aborted) == 1)


async def test_client_survives_a_gateway_restart(aiohttp_client, backend, door_address):
    server = await start_gateway(aiohttp_client, backend, door_address)
    client = await AsyncClient(door_address, timeout=10).connect()
    try:
        assert (await client.generate("a", max_tokens=3)).text == "Hel"
        await server.close()
        await start_gateway(aiohttp_client, backend, door_address)
        assert (await client.generate("a", max_tokens=3)).text == "Hel"
    finally:
        await client.close()


async def test_garbage_at_the_front_door_is_answered_and_counted(gateway, door_address):
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(door_address)
    try:
        await sock.send_multipart([b"\x08\x96\x01garbage"])
        reply = codec.decode(await asyncio.wait_for(sock.recv_multipart(), 5))
        assert reply.kind == "error" and reply.envelope.error.code == pb.Error.BAD_MESSAGE
        await sock.send_multipart([pb.Envelope(batch=pb.Batch(requests=[
            pb.GenerateRequest(request_id="r", prompt_frame=3)])).SerializeToString()])
        reply = codec.decode(await asyncio.wait_for(sock.recv_multipart(), 5))
        assert reply.kind == "error"
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)
    assert gateway.app[FRONTDOOR_KEY].num_dropped == 2
    async with AsyncClient(door_address) as client:
        assert (await client.generate("a", max_tokens=2)).text == "He"
    text = await (await gateway.get("/metrics")).text()
    assert 'tidegate_dropped_frames_total{socket="frontdoor"} 2.0' in text


async def test_connect_timeout_is_typed_and_closes_the_socket():
    address = ipc_address()
    client = AsyncClient(address, connect_timeout=0.2)
    with pytest.raises(RequestTimeout):
        async with client:
            pass
    assert client._sock.closed
    with pytest.raises(RequestTimeout):
        await asyncio.to_thread(Client, address, connect_timeout=0.2)
