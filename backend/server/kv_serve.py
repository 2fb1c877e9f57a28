"""Peers' prefix pulls answered off the worker's step loop (issue 34): a thread with its own ROUTER
socket (`BackendInfo.kv_endpoint`), so that a pull waits neither for the step in progress nor for
the loop's next drain.

    worker loop (main thread)                      KV server thread
      holds `lock` except while it polls its           KvPull arrives on its own socket
      sockets or runs the forward pass           ->    under lock: look the blocks up, hold them
      (ContinuousEngine.step_unlocked)                  (BlockManager.hold_prefix), record where
                                                        the device's queued writes end (CUDA)
                                                       copy them out without the lock
                                                       under lock: release them; send KvBlocks

The lock guards the block manager's Python state only (dicts and lists the loop mutates while it
plans a step); it is never held while bytes move, so the loop waits at most for one lookup.
The blocks read are registered prefix-cache blocks: their K/V was computed before they were
registered, a held block cannot be evicted and rewritten, so the copy needs no step boundary.

A pull that may be answered by CUDA IPC (`KvPull.ipc`, a puller on this host) gets the blocks'
ids and the pools' handles instead of their bytes (`transfer.answer_pull_ipc`); its blocks stay
held (a lease) until the puller's `KvRelease` arrives here, or `IPC_LEASE_S` after the answer
(a puller that died), then they are released under the lock.

A pull that asks to wait for a prefill in flight (`KvPull.wait_s`, disaggregated prefill) is
checked again every `DEFERRED_POLL_S` until its blocks are all there or its wait ends, then
answered with what is held. The worker's main socket still answers KvPulls between its steps
(a peer of an older gateway names that endpoint).
"""
from __future__ import annotations

import sys
import threading
import time

import torch
import zmq

from backend.kv.transfer import KVPort, answer_pull, answer_pull_ipc
from proto import codec
from proto import tidegate_pb2 as pb

DEFERRED_POLL_S = 0.005
MAX_SEND_HWM = 64  # replies queued for one slow puller before the ROUTER drops (it times out)
# How long blocks lent by CUDA IPC stay held without the puller's KvRelease: past its own pull
# deadline (scheduler.kv_cost.PullConfig.timeout_s, 60 s) it no longer reads them
IPC_LEASE_S = 90.0


def kv_listen_for(listen: str) -> str:
    """The KV socket's address next to the worker's: ipc://X -> ipc://X.kv, tcp://H:P -> tcp://H:*
    (a free port), inproc://X -> inproc://X.kv."""
    if listen.startswith("tcp://"):
        host = listen[len("tcp://"):].rsplit(":", 1)[0]
        return f"tcp://{host}:*"
    return listen + ".kv"


class KVServer:
    """Answers KvPull messages on its own socket in a daemon thread (module docstring)."""

    def __init__(self, port: KVPort, lock: threading.Lock, listen: str,
                 ctx: zmq.Context | None = None, security=None, checksum: bool = True,
                 clock=time.monotonic) -> None:
        self.port, self.lock, self.checksum, self.clock = port, lock, checksum, clock
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, codec.MAX_FRAME_BYTES)
        self.sock.setsockopt(zmq.SNDHWM, MAX_SEND_HWM)
        if security is not None and listen.startswith("tcp://"):
            security.apply_server(self.sock)
        self.sock.bind(listen)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._deferred: list[tuple[bytes, codec.Decoded, float]] = []
        # blocks lent by CUDA IPC: (puller identity, pull id) -> (where, lease deadline)
        self._leases: dict[tuple[bytes, int], tuple[list, float]] = {}
        self.num_ipc_served = 0
        self.num_leases_expired = 0
        self.num_served = 0
        self.num_bad = 0          # messages that were not a readable KvPull
        self.serve_s = 0.0        # summed seconds from a pull's arrival to its reply queued
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="tidegate-kv-serve", daemon=True)
        self.thread.start()

    # ---- the thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        sock = self.sock
        # OpenMP's thread count is per calling thread: without this the gathers here would run
        # on a default-sized (all cores) pool beside a backend told --cpu-threads N
        torch.set_num_threads(torch.get_num_threads())
        try:
            while not self._stop.is_set():
                if self._leases:
                    self._expire_leases()
                timeout = DEFERRED_POLL_S if self._deferred else 0.1
                if sock.poll(int(timeout * 1000)):
                    for _ in range(256):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._on_message(frames[0].bytes, frames[1:])
                if self._deferred:
                    self._answer_deferred()
        except Exception as exc:  # noqa: BLE001 -- pullers time out and recompute
            print(f"tidegate backend: KV server stopped: {exc!r}", file=sys.stderr)
        finally:
            sock.close(linger=0)

    def _on_message(self, identity: bytes, frames: list) -> None:
        t0 = self.clock()
        try:
            msg = codec.decode(frames)
            if msg.kind == "kv_release":
                self._release(identity, msg.envelope.kv_release.pull_id)
                return
            if msg.kind != "kv_pull":
                raise codec.DecodeError(f"the KV socket takes kv_pull messages, not {msg.kind}")
        except codec.DecodeError as exc:
            self.num_bad += 1
            self._send(identity, codec.encode_trusted(codec.make_error(pb.Error.BAD_MESSAGE,
                                                                       str(exc))))
            return
        pull = msg.envelope.kv_pull
        if pull.wait_s > 0 and not self._complete(msg):
            self._deferred.append((identity, msg, t0 + min(pull.wait_s, 600.0)))
            return
        self._answer(identity, msg, t0)

    def _answer(self, identity: bytes, msg: codec.Decoded, t0: float) -> None:
        pull = msg.envelope.kv_pull
        try:
            frames = None
            if pull.ipc:
                lent = answer_pull_ipc(self.port, pull, codec.array_of(msg, pull.prompt_frame),
                                       self.lock)
                if lent is not None:
                    frames, where = lent
                    old = self._leases.pop((identity, pull.pull_id), None)
                    if old is not None:  # a pull id used twice: the first lease ends now
                        self.port.release(old[0], self.lock)
                    self._leases[(identity, pull.pull_id)] = (where, self.clock() + IPC_LEASE_S)
                    self.num_ipc_served += 1
            if frames is None:
                frames = answer_pull(self.port, pull, codec.array_of(msg, pull.prompt_frame),
                                     self.checksum, lock=self.lock)
        except Exception as exc:  # noqa: BLE001 -- an explicit error: the puller recomputes
            frames = [pb.Envelope(kv_blocks=pb.KvBlocks(
                pull_id=pull.pull_id, start_block=pull.start_block,
                error=f"reading the blocks failed: {exc}")).SerializeToString()]
        self.num_served += 1
        self._send(identity, frames)
        self.serve_s += self.clock() - t0

    def _complete(self, msg: codec.Decoded) -> bool:
        pull = msg.envelope.kv_pull
        prompt = codec.array_of(msg, pull.prompt_frame)
        if prompt is None or not pull.max_blocks:
            return True
        ids = prompt.tolist()
        with self.lock:
            held = self.port.bm.held_prefix(ids, pull.start_block, pull.max_blocks)
        return len(held) >= pull.max_blocks

    def _answer_deferred(self) -> None:
        now, keep = self.clock(), []
        for identity, msg, deadline in self._deferred:
            if now >= deadline or self._complete(msg):
                self._answer(identity, msg, now)
            else:
                keep.append((identity, msg, deadline))
        self._deferred = keep

    def _release(self, identity: bytes, pull_id: int) -> None:
        lease = self._leases.pop((identity, pull_id), None)
        if lease is not None:  # else: expired already, or a stray release
            self.port.release(lease[0], self.lock)

    def _expire_leases(self) -> None:
        now = self.clock()
        for key, (where, deadline) in list(self._leases.items()):
            if now >= deadline:
                del self._leases[key]
                self.port.release(where, self.lock)
                self.num_leases_expired += 1

    @property
    def num_leases(self) -> int:
        return len(self._leases)

    def _send(self, identity: bytes, frames: list) -> None:
        try:
            self.sock.send_multipart([identity, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:  # the puller is gone or not reading: it times out and recomputes
            pass

    # ---- the owner -------------------------------------------------------------------------------
    @property
    def num_deferred(self) -> int:
        return len(self._deferred)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        # the thread is gone: release what it lent, without the lock (its owner calls this,
        # from its loop's shutdown while holding it, or after the loop has ended)
        for where, _ in self._leases.values():
            self.port.release(where)
        self._leases.clear()
