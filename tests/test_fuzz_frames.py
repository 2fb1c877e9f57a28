"""Fuzz the ZeroMQ sockets (issue 13): random and mutated multipart messages at the gateway's
front door and at a backend worker (the echo engine, a real process). Nothing crashes, a
well-formed request sent between the fuzz still gets its answer, and afterwards every KV block
is back in the pool.

CI runs FUZZ_FRAMES (default 600) messages per socket; `scripts/fuzz_long.sh` runs 10,000.
"""
from __future__ import annotations

import asyncio
import os
import time

import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from test_gateway_fakes import DEFAULT_TEXT, FakeBackend
from test_gateway_http import ipc_address, make_config

from gateway.app import create_app
from gateway.backend_pool import PoolConfig
from gateway.client import AsyncClient
from gateway.frontdoor import FRONTDOOR_KEY, frontdoor_ctx
from proto import codec
from proto import tidegate_pb2 as pb
from tests.backend_helpers import DealerClient, WorkerProcess

NUM_FRAMES = int(os.environ.get("FUZZ_FRAMES", "600"))
CHECK_EVERY = 200  # a well-formed request after this many fuzzed messages

u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
doubles = st.floats(allow_nan=True, allow_infinity=True)
small = st.integers(0, 40)
names = st.text(max_size=10)


@st.composite
def sampling(draw):
    s = pb.SamplingParams(max_tokens=draw(st.one_of(small, u32)), temperature=draw(doubles),
                          top_p=draw(doubles), top_k=draw(i32), ignore_eos=draw(st.booleans()),
                          logprobs=draw(st.one_of(st.integers(0, 5), u32)))
    if draw(st.booleans()):
        s.seed = draw(i64)
    s.stop.extend(draw(st.lists(st.text(max_size=300), max_size=20)))
    s.stop_token_ids.extend(draw(st.lists(i32, max_size=3)))
    return s


@st.composite
def envelopes(draw):
    kind = draw(st.sampled_from(["batch", "batch", "batch", "abort", "hello", "health",
                                 "step_output", "load_report", "error", "backend_info"]))
    env = pb.Envelope()
    arrays = draw(st.lists(st.lists(st.one_of(st.integers(0, 300), i32), max_size=8),
                           max_size=3))
    if kind == "batch":
        for _ in range(draw(st.integers(0, 4))):
            env.batch.requests.add(request_id=draw(names), prompt_frame=draw(st.integers(-2, 4)),
                                   prompt_text=draw(st.text(max_size=20)),
                                   sampling=draw(sampling()), priority=draw(i32),
                                   arrival_time=draw(doubles), deadline=draw(doubles))
        if not env.batch.requests:
            env.batch.SetInParent()
        env.batch.batch_id = draw(st.one_of(st.just(0), st.integers(0, 2**64 - 1)))
    elif kind == "abort":
        env.abort.request_ids.extend(draw(st.lists(names, max_size=4)))
    elif kind == "hello":
        env.hello.protocol_version = draw(st.sampled_from(["1.0", "1.9", "2.0", "x", "", "1."]))
        env.hello.role = draw(st.integers(0, 5))
    elif kind == "health":
        env.health.nonce = draw(st.integers(0, 2**64 - 1))
        env.health.reply = draw(st.booleans())
    elif kind == "step_output":
        env.step_output.outputs.add(request_id=draw(names), tokens_frame=draw(st.integers(-1, 3)))
    elif kind == "load_report":
        env.load_report.num_running = draw(u32)
    elif kind == "error":
        env.error.code = draw(st.integers(0, 12))
        env.error.request_id = draw(names)
        env.error.batch_id = draw(st.integers(0, 2**64 - 1))
    else:
        env.backend_info.protocol_version = "1.0"
    frames = codec.encode_trusted(env) + [  # a Batch's id leads frame 0, as senders write it
        b"".join(int(t).to_bytes(4, "little", signed=True) for t in a) for a in arrays]
    mutation = draw(st.sampled_from(["none", "none", "flip", "cut", "raw", "odd", "extra"]))
    if mutation == "flip" and frames[0]:
        i = draw(st.integers(0, len(frames[0]) - 1))
        frames[0] = frames[0][:i] + bytes([draw(st.integers(0, 255))]) + frames[0][i + 1:]
    elif mutation == "cut":
        frames[0] = frames[0][:draw(st.integers(0, len(frames[0])))]
    elif mutation == "raw":
        frames = draw(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
    elif mutation == "odd":
        frames.append(draw(st.binary(min_size=1, max_size=7)))
    elif mutation == "extra":
        frames = frames + [b""] * draw(st.integers(1, 5))
    return frames


def generate(n: int) -> list[list[bytes]]:
    out: list[list[bytes]] = []

    @seed(int(os.environ.get("FUZZ_SEED", "13")))
    @settings(max_examples=n, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(envelopes())
    def collect(frames):
        out.append(frames)

    collect()
    return out


# --- the gateway's front door ------------------------------------------------------------------
@pytest.fixture
async def backend():
    b = await FakeBackend(ipc_address(), step_s=0.0005, max_model_len=64).start()
    yield b
    await b.stop()


async def test_fuzzed_frames_at_the_front_door(aiohttp_client, backend):
    door = ipc_address()
    # a wide heartbeat window: the fake backend shares this (busy) event loop; see test_fuzz_http
    pool = PoolConfig(heartbeat_timeout_s=60.0, hello_interval_s=0.1)
    app = create_app(make_config(backend.address, pool=pool), startup_wait_s=5.0,
                     extra_cleanup_ctx=[frontdoor_ctx(door)])
    await aiohttp_client(app)
    messages = generate(NUM_FRAMES)
    ctx = zmq.asyncio.Context()
    fuzzer = ctx.socket(zmq.DEALER)
    fuzzer.setsockopt(zmq.LINGER, 0)
    fuzzer.connect(door)
    replies = 0
    async with AsyncClient(door, timeout=20) as good:
        for i, frames in enumerate(messages):
            await fuzzer.send_multipart(frames)
            while await fuzzer.poll(0):
                await fuzzer.recv_multipart()
                replies += 1
            if i % CHECK_EVERY == CHECK_EVERY - 1:
                result = await good.generate("ok", max_tokens=5)
                assert result.text == DEFAULT_TEXT[:5]
        result = await good.generate("ok", max_tokens=5)
        assert result.text == DEFAULT_TEXT[:5]
    fuzzer.close(linger=0)  # gone: whatever it started is aborted
    ctx.destroy(linger=0)
    front = app[FRONTDOOR_KEY]
    deadline = time.monotonic() + 20
    while (backend.running or front._handles) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    print(f"\nfront door: fuzzed {len(messages)} messages, {replies} replies read, "
          f"{front.num_dropped} counted malformed")
    assert len(messages) >= NUM_FRAMES * 0.95
    assert not front._handles and not backend.running
    assert backend.num_free_blocks == backend.num_total_blocks


# --- a backend worker --------------------------------------------------------------------------
def test_fuzzed_frames_at_a_backend_worker(tmp_path):
    worker = WorkerProcess(["--model", "echo", "--max-model-len", "256", "--num-blocks", "4096"],
                           f"ipc://{tmp_path}/w.sock")
    try:
        messages = generate(NUM_FRAMES)
        fuzzer = zmq.Context.instance().socket(zmq.DEALER)
        fuzzer.setsockopt(zmq.LINGER, 0)
        fuzzer.connect(worker.endpoint)
        good = DealerClient(worker.endpoint)
        info = good.hello()
        for i, frames in enumerate(messages):
            fuzzer.send_multipart(frames)
            while fuzzer.poll(0):
                fuzzer.recv_multipart()
            if i % CHECK_EVERY == CHECK_EVERY - 1:
                rid = f"good-{i}"
                good.batch({rid: [1, 2, 3]}, max_tokens=4)
                tokens, _, _ = good.collect([rid], timeout_s=30)
                assert tokens[rid] == [1, 2, 3, 1], good.errors[-3:]
        fuzzer.close(linger=0)  # its requests are aborted once the worker notices
        assert worker.proc.poll() is None, worker.proc.stderr.read()
        deadline = time.monotonic() + 20
        report = None
        while time.monotonic() < deadline:
            m = good.recv(5)
            if m.kind == "load_report":
                report = m.envelope.load_report
                if report.num_running == 0 and report.num_free_blocks == info.num_kv_blocks:
                    break
        assert report is not None and report.num_running == 0 and report.num_waiting == 0
        assert report.num_free_blocks == info.num_kv_blocks
        print(f"\nbackend: fuzzed {len(messages)} messages; worker alive, "
              f"{report.num_free_blocks}/{info.num_kv_blocks} blocks free")
        good.close()
    finally:
        worker.kill()



