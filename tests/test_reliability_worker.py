"""Issue 13 at the backend: the worker checks what the wire brings against the model, keeps a
fault with its request, and forgets gateways that left (their KV blocks return to the pool).
Each test fails on the code before the fix."""
from __future__ import annotations

import time

import pytest

from proto import codec
from proto import tidegate_pb2 as pb
from tests.backend_helpers import DealerClient, WorkerProcess


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    # One worker for the module (each test talks over its own connection): a worker's start
    # costs seconds on a small machine.
    w = WorkerProcess(["--model", "tiny", "--num-blocks", "256", "--max-num-seqs", "8"],
                      f"ipc://{tmp_path_factory.mktemp('rel')}/w.sock")
    yield w
    w.kill()


def test_logprobs_above_the_vocabulary_fail_only_their_request(worker):
    c = DealerClient(worker.endpoint)
    info = c.hello()
    env = pb.Envelope(batch=pb.Batch())
    for rid, n in (("ok", 2), ("huge", info.vocab_size + 41)):
        env.batch.requests.add(request_id=rid, prompt_frame=0,
                               sampling=pb.SamplingParams(max_tokens=4, logprobs=n,
                                                          temperature=1.0, seed=1))
    c.send(env, [[256, 1, 2]])
    tokens, finals, _ = c.collect(["ok", "huge"])
    assert [e.request_id for e in c.errors] == ["huge"]
    assert c.errors[0].code == pb.Error.INVALID_REQUEST and "logprobs" in c.errors[0].message
    assert len(tokens["ok"]) == 4 and finals["ok"].finish_reason == pb.RequestOutput.LENGTH
    assert all(len(lp.top_ids) == 2 for lp in c.logprobs["ok"])
    c.close()


@pytest.mark.parametrize("field,value", [("temperature", float("nan")),
                                         ("top_p", float("inf")), ("max_tokens", 0)])
def test_sampling_values_the_engine_cannot_use_are_refused(worker, field, value):
    c = DealerClient(worker.endpoint)
    c.hello()
    c.batch({"bad": [1, 2]}, **{"max_tokens": 3, field: value})
    c.batch({"good": [1, 2]}, max_tokens=3)
    tokens, _, _ = c.collect(["bad", "good"])
    assert [(e.request_id, e.code) for e in c.errors] == [("bad", pb.Error.INVALID_REQUEST)]
    assert len(tokens["good"]) == 3
    c.close()


def test_a_batch_that_cannot_be_decoded_is_answered_per_request(worker):
    c = DealerClient(worker.endpoint)
    c.hello()
    env = pb.Envelope(batch=pb.Batch())
    for rid in ("a", "b"):
        env.batch.requests.add(request_id=rid, prompt_frame=5,  # no such array
                               sampling=pb.SamplingParams(max_tokens=2))
    env.batch.batch_id = 41
    c.sock.send_multipart(codec.encode(env, [[1]] * 6)[:1])  # the arrays are missing
    c.collect(["a", "b"], timeout_s=10)
    assert sorted((e.request_id, e.code, e.batch_id) for e in c.errors) == [
        ("a", pb.Error.BAD_MESSAGE, 41), ("b", pb.Error.BAD_MESSAGE, 41)]
    c.close()


def test_a_batch_whose_envelope_does_not_parse_is_answered_with_its_batch_id(worker):
    # Nothing past the Batch's head parses (no request id can be read), yet the Error names the
    # Batch, so the gateway fails exactly its requests and no others.
    c = DealerClient(worker.endpoint)
    c.hello()
    env = pb.Envelope(batch=pb.Batch(batch_id=2**40 + 7))
    env.batch.requests.add(request_id="lost", prompt_frame=0, sampling=pb.SamplingParams(max_tokens=2))
    frame = codec.encode(env, [[1, 2]])[0]
    head = frame[:3 + len(codec._varint(2**40 + 7))]
    c.sock.send_multipart([head + b"\xff" * 12, b"\0" * 8])  # a tag that never ends
    m = c.recv()
    while m.kind != "error":
        m = c.recv()
    err = m.envelope.error
    assert (err.code, err.request_id, err.batch_id) == (pb.Error.BAD_MESSAGE, "", 2**40 + 7)
    c.close()


def test_a_gateway_that_leaves_has_its_requests_aborted_and_is_forgotten(worker):
    gone = DealerClient(worker.endpoint)
    gone.hello()
    gone.batch({"long": [256, 1, 2]}, max_tokens=2000, ignore_eos=True)
    m = gone.recv()
    while m.kind != "step_output":
        m = gone.recv()
    gone.sock.close(linger=0)  # no Abort: the connection just drops
    watcher = DealerClient(worker.endpoint)
    info = watcher.hello()
    deadline = time.monotonic() + 10
    report = None
    while time.monotonic() < deadline:
        m = watcher.recv()
        if m.kind == "load_report":
            report = m.envelope.load_report
            if report.num_running == 0:
                break
    assert report is not None and report.num_running == 0
    assert report.num_free_blocks == info.num_kv_blocks  # every block came back
    watcher.close()


def test_a_message_over_the_size_limit_closes_only_that_connection(worker):
    big = DealerClient(worker.endpoint)
    big.hello()
    big.sock.send_multipart([b"\0" * (codec.MAX_FRAME_BYTES + 1)])
    other = DealerClient(worker.endpoint)
    other.hello()
    other.batch({"x": [1, 2]}, max_tokens=2)
    tokens, _, _ = other.collect(["x"])
    assert len(tokens["x"]) == 2
    big.close()
    other.close()


def test_a_gateway_that_stops_reading_is_held_then_dropped_not_silently_dropped(tmp_path):
    # The echo engine makes one message per step; a peer that never reads fills the socket
    # queue, then the worker's own bounded hold queue, then is dropped with its requests.
    w = WorkerProcess(["--model", "echo", "--max-model-len", "4096", "--num-blocks", "512",
                       "--max-held-messages", "50"], f"ipc://{tmp_path}/held.sock")
    try:
        import zmq

        stuck = zmq.Context.instance().socket(zmq.DEALER)
        stuck.setsockopt(zmq.RCVHWM, 1)
        stuck.setsockopt(zmq.LINGER, 0)
        stuck.connect(w.endpoint)
        env = pb.Envelope(batch=pb.Batch())
        env.batch.requests.add(request_id="slow-reader", prompt_frame=0,
                               sampling=pb.SamplingParams(max_tokens=4000))
        stuck.send_multipart(codec.encode(env, [[1, 2, 3]]))
        watcher = DealerClient(w.endpoint)
        info = watcher.hello()
        deadline = time.monotonic() + 30
        report = None
        while time.monotonic() < deadline:  # until the stuck peer's request is gone
            m = watcher.recv()
            if m.kind == "load_report":
                report = m.envelope.load_report
                if report.num_running == 0 and report.num_free_blocks == info.num_kv_blocks:
                    break
        assert report is not None and report.num_running == 0
        assert report.num_free_blocks == info.num_kv_blocks
        # observable: the LoadReport (and the gateway's /metrics) carry the back-pressure
        assert report.num_held_messages >= 50 and report.num_dropped_peers == 1
        # the peer only ever got what fit in the queues: far fewer than 4000 steps' outputs
        got = 0
        while stuck.poll(200):
            stuck.recv_multipart()
            got += 1
        assert 0 < got < 4000
        stuck.close(linger=0)
        watcher.close()
        assert w.terminate() == 0
        assert "not reading" in w.proc.stderr.read()
    finally:
        w.kill()
