"""Prefix pull by CUDA IPC (issue 34, `backend.kv.cuda_ipc`): the peer lends its blocks (ids, its
pools' handles, an event) instead of sending their bytes, holds them until the puller's
KvRelease or its lease's end, and the puller copies them device to device.

The mapping itself needs two CUDA processes (tests/test_kv_pull_ipc_gpu.py, GPU-marked). Here,
on the CPU, the protocol around it runs for real with the two CUDA calls stood in for: "sharing"
returns placeholder descriptors and "mapping" returns the peer's own block tensors (both backends
live in this process), so the copy, the books, the release and every failure path are the real
code's.
"""
import time

import pytest

from backend.kv import cuda_ipc
from backend.kv.transfer import PullError, check_ipc_reply, make_pull
from proto import tidegate_pb2 as pb
from tests.backend_helpers import DealerClient
from tests.test_kv_pull import MAX_TOKENS, PROMPT, Backend, block_bytes_of


def ipc_pull(backend, pull_id: int = 5) -> pb.Envelope:
    env = make_pull(pull_id, 0, backend.worker.puller.port.layout, 12)
    env.kv_pull.ipc = True
    return env


@pytest.fixture
def lend_on_cpu(monkeypatch):
    """The holder's CUDA calls stood in for: its pools 'shared' as placeholders."""
    monkeypatch.setattr(cuda_ipc, "available", lambda device: True)
    monkeypatch.setattr(cuda_ipc, "record_event", lambda stream: b"event")
    monkeypatch.setattr(cuda_ipc, "share",
                        lambda tensors: [pb.IpcTensor(handle=b"h%d" % i, dtype="uint8")
                                         for i in range(len(tensors))])


def wait_until(cond, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_a_backend_without_cuda_answers_an_ipc_pull_with_frames(tmp_path):
    peer = Backend(tmp_path, "peer")
    try:
        peer.run("warm")
        c = DealerClient(peer.worker.kv_server.endpoint)
        c.send(ipc_pull(peer), [PROMPT])
        m = c.recv(5).envelope.kv_blocks
        assert m.num_blocks == 12 and m.num_frames >= 1 and not m.ipc_block_ids
        assert peer.worker.kv_server.num_leases == 0
        c.close()
        peer.assert_no_leak()
    finally:
        peer.close()


def test_lent_blocks_stay_held_until_the_release_or_the_lease_end(tmp_path, lend_on_cpu,
                                                                    monkeypatch):
    from backend.server import kv_serve

    peer = Backend(tmp_path, "peer")
    try:
        peer.run("warm")
        server = peer.worker.kv_server
        c = DealerClient(server.endpoint)
        c.send(ipc_pull(peer, 5), [PROMPT])
        m = c.recv(5).envelope.kv_blocks
        assert m.num_blocks == 12 and m.num_frames == 0 and len(m.ipc_block_ids) == 12
        assert m.ipc_event == b"event" and len(m.ipc_pools) == len(peer.worker.puller.port.tensors)
        assert check_ipc_reply([pb.Envelope(kv_blocks=m).SerializeToString()],
                               peer.worker.puller.port.layout, m.block_bytes, 0, 12) == m
        assert peer.bm.num_read_held_blocks == 12 and server.num_leases == 1
        c.send(pb.Envelope(kv_release=pb.KvRelease(pull_id=5)))
        assert wait_until(lambda: peer.bm.num_read_held_blocks == 0)
        assert server.num_leases == 0 and server.num_leases_expired == 0
        # a puller that never releases: the lease ends and the blocks go back
        monkeypatch.setattr(kv_serve, "IPC_LEASE_S", 0.3)
        c.send(ipc_pull(peer, 6), [PROMPT])
        assert len(c.recv(5).envelope.kv_blocks.ipc_block_ids) == 12
        assert peer.bm.num_read_held_blocks == 12
        assert wait_until(lambda: peer.bm.num_read_held_blocks == 0)
        assert server.num_leases_expired == 1 and server.num_leases == 0
        c.send(pb.Envelope(kv_release=pb.KvRelease(pull_id=6)))   # late: nothing to release
        peer.assert_no_leak()
        # lent when the backend shuts down: released then (its loop holds the lock: no deadlock)
        monkeypatch.setattr(kv_serve, "IPC_LEASE_S", 600.0)
        c.send(ipc_pull(peer, 7), [PROMPT])
        assert len(c.recv(5).envelope.kv_blocks.ipc_block_ids) == 12
        c.close()
    finally:
        peer.close()
    assert peer.bm.num_read_held_blocks == 0 and peer.worker.kv_server.num_leases == 0


def test_an_ipc_pull_copies_the_peers_blocks_bit_for_bit(tmp_path, lend_on_cpu, monkeypatch):
    peer = Backend(tmp_path, "peer")
    me = Backend(tmp_path, "me")
    try:
        want, _, _ = peer.run("warm")
        # "mapping" the peer's pools in this process: its own tensors
        monkeypatch.setattr(cuda_ipc, "open_tensors",
                            lambda descs: list(peer.worker.puller.port.tensors))
        monkeypatch.setattr(cuda_ipc, "wait_event", lambda handle, device: None)
        me.worker.puller.ipc = True
        got, final, _ = me.run("r", source=peer.worker.kv_server.endpoint)
        assert final.num_cached_tokens == 192 and got == want
        assert block_bytes_of(me, PROMPT) == block_bytes_of(peer, PROMPT)
        assert me.worker.puller.num_ipc_pulls == 1 and peer.worker.kv_server.num_ipc_served == 1
        assert me.report().num_kv_pulls_ipc == 1
        assert wait_until(lambda: peer.bm.num_read_held_blocks == 0)  # released after the copy
        for b in (peer, me):
            b.assert_no_leak()
    finally:
        me.close()
        peer.close()


def test_a_failed_mapping_recomputes_releases_and_turns_ipc_off(tmp_path, lend_on_cpu,
                                                                  monkeypatch):
    peer = Backend(tmp_path, "peer")
    me = Backend(tmp_path, "me")
    try:
        want, _, _ = peer.run("warm")

        def refuse(descs):
            raise RuntimeError("cudaIpcOpenMemHandle: invalid device context")

        monkeypatch.setattr(cuda_ipc, "open_tensors", refuse)
        me.worker.puller.ipc = True
        got, final, _ = me.run("r", source=peer.worker.kv_server.endpoint)
        assert len(got) == MAX_TOKENS and got == want and final.num_cached_tokens == 0
        assert not me.worker.puller.ipc and "mapping the peer's pages failed" in \
            me.worker.puller.last_error
        assert wait_until(lambda: peer.bm.num_read_held_blocks == 0)
        assert peer.worker.kv_server.num_leases == 0
        for b in (peer, me):
            b.assert_no_leak()
    finally:
        me.close()
        peer.close()


def test_check_ipc_reply_trusts_nothing():
    layout = "m|auto|bs16"

    def reply(**kw):
        base = {"pull_id": 1, "start_block": 0, "num_blocks": 2, "block_bytes": 64,
                "layout": layout, "ipc_block_ids": [4, 9], "ipc_event": b"e",
                "ipc_pools": [pb.IpcTensor(handle=b"h")]}
        return [pb.Envelope(kv_blocks=pb.KvBlocks(**{**base, **kw})).SerializeToString()]

    assert check_ipc_reply(reply(), layout, 64, 0, 2).ipc_block_ids == [4, 9]
    frames_reply = [pb.Envelope(kv_blocks=pb.KvBlocks(pull_id=1, num_blocks=1, num_frames=1))
                    .SerializeToString(), b"x" * 64]
    assert check_ipc_reply(frames_reply, layout, 64, 0, 2) is None   # check_reply's to read
    for bad, frames in (("names 1 blocks", reply(ipc_block_ids=[4])),
                        ("at most 1", reply()[:1]),
                        ("no data frames", reply() + [b"x"]),
                        ("without the peer's pools", reply(ipc_pools=[])),
                        ("layout", reply(layout="other")),
                        ("peer: busy", reply(error="busy"))):
        max_blocks = 1 if bad == "at most 1" else 2
        with pytest.raises(PullError, match=bad):
            check_ipc_reply(frames, layout, 64, 0, max_blocks)
