"""CURVE on the TCP ZeroMQ sockets, the ZAP allow-list, the refusal of an open bind, and the
front door's API key (issue 13), end to end: the client library against the gateway's front
door, and the gateway's pool against a real backend process (the echo engine)."""
from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest
import zmq
from test_gateway_fakes import DEFAULT_TEXT, FakeBackend
from test_gateway_http import ipc_address, make_config

from gateway.app import create_app
from gateway.backend_pool import BackendPool, Dispatch, PoolConfig
from gateway.client import AsyncClient, AuthenticationError, Client, RequestTimeout
from gateway.frontdoor import frontdoor_ctx
from proto import tidegate_pb2 as pb
from proto.security import (
    CurveKeys,
    SecurityError,
    check_bind,
    generate,
    is_loopback_or_local,
    load_pair,
)


def free_tcp() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    out = {name: generate(root, name) for name in ("server", "client", "stranger")}
    allow = root / "allowed"
    allow.mkdir()
    (allow / "client.key").write_bytes(out["client"][0].read_bytes())
    return allow, out


def test_keys_generate_writes_a_private_secret_and_prints_no_key(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gateway.tidegate_cli", "keys", "generate",
                           str(tmp_path), "--name", "gw"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    public, secret = load_pair(tmp_path / "gw.key_secret")
    assert (tmp_path / "gw.key_secret").stat().st_mode & 0o077 == 0
    assert public.decode() not in proc.stdout and secret.decode() not in proc.stdout


def test_open_tcp_bind_is_refused_without_keys():
    assert is_loopback_or_local("ipc:///tmp/x.sock")
    assert is_loopback_or_local("tcp://127.0.0.1:5555") and is_loopback_or_local("tcp://[::1]:1")
    assert not is_loopback_or_local("tcp://0.0.0.0:5555")
    assert not is_loopback_or_local("tcp://*:5555")
    assert not is_loopback_or_local("tcp://10.1.2.3:5555")
    with pytest.raises(SecurityError, match="--insecure"):
        check_bind("tcp://0.0.0.0:5555", None, insecure=False)
    check_bind("tcp://0.0.0.0:5555", None, insecure=True)
    check_bind("tcp://127.0.0.1:5555", None, insecure=False)


def test_backend_refuses_an_open_bind_without_keys():
    proc = subprocess.run([sys.executable, "-m", "gateway.tidegate_cli", "backend", "--model",
                           "echo", "--listen", "tcp://0.0.0.0:0"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode != 0 and "refusing to listen" in proc.stderr


# --- the front door and the client library ----------------------------------------------------
@pytest.fixture
async def backend():
    b = await FakeBackend(ipc_address()).start()
    yield b
    await b.stop()


async def start_door(aiohttp_client, backend, keys, **config):
    allow, pairs = keys
    door = free_tcp()
    curve = CurveKeys(pairs["server"][1], allow_dir=allow)
    app = create_app(make_config(backend.address, **config), startup_wait_s=5.0,
                     extra_cleanup_ctx=[frontdoor_ctx(door, curve)])
    await aiohttp_client(app)
    return door


async def test_curve_front_door_admits_only_listed_client_keys(aiohttp_client, backend, keys,
                                                               caplog):
    _allow, pairs = keys
    door = await start_door(aiohttp_client, backend, keys)
    server_public = str(pairs["server"][0])
    async with AsyncClient(door, curve_key=str(pairs["client"][1]),
                           server_key=server_public) as c:
        assert (await c.generate("hi", max_tokens=100)).text == DEFAULT_TEXT
    # sync client too (another thread's blocking socket)
    result = await asyncio.to_thread(_sync_generate, door, str(pairs["client"][1]),
                                     server_public)
    assert result == DEFAULT_TEXT[:5]
    # a key pair not in the allow-list, and no CURVE at all: no answer (the handshake fails)
    for kw in ({"curve_key": str(pairs["stranger"][1]), "server_key": server_public}, {}):
        with pytest.raises(RequestTimeout):
            async with AsyncClient(door, connect_timeout=1.0, **kw) as c:
                await c.generate("hi", max_tokens=2)
    secret = load_pair(pairs["server"][1])[1].decode()
    assert secret not in caplog.text


def _sync_generate(door, key, server_key):
    with Client(door, curve_key=key, server_key=server_key) as c:
        return c.generate("hi", max_tokens=5).text


async def test_front_door_honours_the_api_key(aiohttp_client, backend, keys):
    _allow, pairs = keys
    door = await start_door(aiohttp_client, backend, keys, api_key="sesame")
    kw = {"curve_key": str(pairs["client"][1]), "server_key": str(pairs["server"][0])}
    with pytest.raises(AuthenticationError):
        async with AsyncClient(door, **kw) as c:
            pass
    with pytest.raises(AuthenticationError):
        async with AsyncClient(door, api_key="wrong", **kw) as c:
            pass
    # a Batch on a connection that never said Hello with the key is refused per request
    ctx = zmq.asyncio.Context()
    raw = ctx.socket(zmq.DEALER)
    CurveKeys(pairs["client"][1], pairs["server"][0]).apply_client(raw)
    raw.connect(door)
    from proto import codec

    req = pb.GenerateRequest(request_id="sneak", prompt_frame=0,
                             sampling=pb.SamplingParams(max_tokens=2))
    await raw.send_multipart(codec.encode(pb.Envelope(batch=pb.Batch(requests=[req])), [[1]]))
    reply = codec.decode(await asyncio.wait_for(raw.recv_multipart(), 5))
    assert reply.envelope.error.code == pb.Error.UNAUTHENTICATED
    assert reply.envelope.error.request_id == "sneak" and not backend.received
    raw.close(linger=0)
    ctx.destroy(linger=0)
    async with AsyncClient(door, api_key="sesame", **kw) as c:
        assert (await c.generate("hi", max_tokens=3)).text == DEFAULT_TEXT[:3]


# --- gateway <-> backend -----------------------------------------------------------------------
def start_backend(address: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "gateway.tidegate_cli", "backend", "--model",
                             "echo", "--listen", address, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "ready" in line, proc.stderr.read()
    return proc


class Sink:
    def __init__(self):
        self.tokens, self.finish, self.errors = [], None, []

    def on_tokens(self, ids, finish, lps, now):
        self.tokens += ids
        self.finish = finish

    def on_error(self, err):
        self.errors.append(err)


async def test_gateway_and_backend_speak_curve_and_strangers_are_refused(keys):
    allow, pairs = keys
    address = free_tcp()
    proc = start_backend(address, "--curve-key", str(pairs["server"][1]), "--curve-allow",
                         str(allow))
    try:
        good = BackendPool([address], PoolConfig(hello_interval_s=0.1, curve=CurveKeys(
            pairs["client"][1], pairs["server"][0])))
        stranger = BackendPool([address], PoolConfig(hello_interval_s=0.1, curve=CurveKeys(
            pairs["stranger"][1], pairs["server"][0])))
        plain = BackendPool([address], PoolConfig(hello_interval_s=0.1))
        for pool in (good, stranger, plain):
            await pool.start()
        try:
            assert await good.wait_ready(20)
            sink = Sink()
            good.send_batch(good.backends[0], [Dispatch("r", [1, 2, 3], pb.SamplingParams(
                max_tokens=5), 0, 0, 0.0, sink)])
            for _ in range(200):
                if sink.finish:
                    break
                await asyncio.sleep(0.05)
            assert sink.finish == "length" and sink.tokens == [1, 2, 3, 1, 2]
            assert not await stranger.wait_ready(1.0) and not await plain.wait_ready(0.1)
        finally:
            for pool in (good, stranger, plain):
                await pool.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    secret = load_pair(pairs["server"][1])[1].decode()
    assert secret not in err
