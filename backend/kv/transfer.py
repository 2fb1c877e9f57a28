"""Prefix pull between backends (issue 34): KV blocks of a prompt's prefix, read out of one
backend's pools (GPU pages or its host tier) and written into another's, as they are stored.

Wire (proto `KvPull` / `KvBlocks`, raw frames, no pickle)::

    puller                                           peer (holds the prefix)
      KvPull{pull_id, prompt_frame, start_block,  ->
             max_blocks, layout} + [int32 prompt]
                                                  <-  KvBlocks{pull_id, start_block, num_blocks,
                                                          block_bytes, first_frame, num_frames,
                                                          layout, error, frame_crc32[]}
                                                      + [raw block rows] * num_frames

A block travels as one row of `block_bytes` bytes: every layer's K then V pool row of that block
(a quantized pool's codes, then its scales), in `backend.kernels.block_gather` order, the same
row the host tier stores. Frames hold whole blocks, at most `codec.MAX_FRAME_BYTES` each. Only
equal layouts exchange blocks (`KVPort.layout`: model, page format, block size, the tensors'
row shapes and dtypes); the peer refuses another with an explicit `error`, and the puller checks
everything again (sizes, frame count, checksums) before it takes a single block.

The receiving side allocates nothing until a whole, valid reply is in hand (`KVPort.import_`):
then its blocks join the prefix cache as free, most recently used cached blocks, so a pull that
fails, times out or answers late leaks nothing, and the request it was for is admitted exactly
once either way (recomputing what did not arrive). The peer reads its blocks either between
two steps (its worker loop, the main socket) or off that loop (`backend.server.kv_serve`, its own
socket and thread: the blocks held against eviction while they are copied out); either way it
holds no reference after it has answered.

`KVTransport` is the seam for moving the bytes: `ZmqKVTransport` (device -> host -> ZMQ) is the
one built; an NCCL or NIXL transport between GPUs would implement the same four calls.

CUDA IPC (`KvPull.ipc`, `tidegate backend --kv-pull-transport cuda-ipc`; `backend.kv.cuda_ipc`):
between backends of one host the bytes need not move through the host at all. The peer answers
from its KV thread with the blocks' ids in its pools, its pools' IPC handles and an interprocess
event (no frames), holding the blocks (a lease) until the puller's `KvRelease`; the puller maps
the pools, waits for the event, copies the blocks device to device (`KVPort.import_ipc`) and
releases them. Blocks on the peer's host tier, a peer answering between steps (its main socket)
or one without CUDA answer with frames as before.
"""
from __future__ import annotations

import hashlib
import warnings
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch
import zmq

from backend.kv import cuda_ipc
from backend.kv.host_tier import _block_tensors
from proto import codec
from proto import tidegate_pb2 as pb
from scheduler.kv_cost import PullConfig

DEFAULT_PULL_TIMEOUT_S = PullConfig.timeout_s  # one default: scheduler.kv_cost


def layout_of(model_name: str, kv_cache_dtype: str, block_size: int,
              tensors: Sequence[torch.Tensor]) -> str:
    """A backend's KV layout name: equal names <=> a block row means the same thing."""
    shapes = ";".join(f"{tuple(t.shape[1:])}:{t.dtype}" for t in tensors)
    digest = hashlib.sha1(shapes.encode()).hexdigest()[:12]
    row = sum(t[0].nbytes for t in tensors)
    return f"{model_name}|{kv_cache_dtype}|bs{block_size}|{row}B|{len(tensors)}t|{digest}"


class KVPort:
    """An engine's side of prefix pull: its block manager (which blocks hold what) and its
    pools' bytes (`store`: a `KVCache` and its host tier, if any)."""

    def __init__(self, block_manager, kv, host_kv, gather_cls, model_name: str,
                 flush_host=None) -> None:
        self.bm = block_manager
        self.host_kv = host_kv
        if host_kv is not None:
            self.tensors, self.gather = host_kv.device_tensors, host_kv.gather
        else:
            self.tensors = [t for pool in (*kv.k_caches, *kv.v_caches) for t in _block_tensors(pool)]
            self.gather = gather_cls(self.tensors)
        self.device = self.tensors[0].device
        self.block_bytes = self.gather.block_bytes
        self.block_size = block_manager.block_size
        self.layout = layout_of(model_name, kv.kv_cache_dtype, kv.block_size, self.tensors)
        self._flush_host = flush_host  # runs the host tier's queued copies (their bytes first)
        # off-loop reads (export with a lock) on CUDA: ordered after the serving loop's stream
        self._main_stream = torch.cuda.current_stream(self.device) \
            if self.device.type == "cuda" else None
        self._side_stream = None
        # device -> host rate of block reads (0 on the CPU: the pools are host memory)
        self.copy_bytes_per_s = self.measure_copy_rate() if self.device.type == "cuda" else 0.0

    def measure_copy_rate(self, num_blocks: int = 16, repeats: int = 3) -> float:
        """Bytes a second of `_read` (gather into staging, then device -> host) on the first
        blocks; only reads, so it may run at any time."""
        import time
        n = min(num_blocks, self.tensors[0].shape[0])
        where = [(True, i) for i in range(n)]
        best = float("inf")
        for _ in range(repeats + 1):  # the first round compiles the gather kernel
            torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            self._read(where)
            best = min(best, time.perf_counter() - t0)
        return n * self.block_bytes / max(best, 1e-9)

    # ---- the peer: read blocks out ------------------------------------------------------------
    def export(self, token_ids: Sequence[int], start_block: int, max_blocks: int = 0,
               max_frame_bytes: int = codec.MAX_FRAME_BYTES,
               lock=None) -> tuple[int, list[np.ndarray]]:
        """(number of blocks, frames): the prompt's blocks from `start_block` that this backend
        holds, each frame [k, block_bytes] uint8 of whole blocks.

        `lock` None: called by the loop that owns the block manager, between two steps. Else
        called from another thread (`backend.server.kv_serve`) while that loop may be stepping:
        the block manager is touched only under `lock` (which the loop holds except while it
        waits or runs the forward pass), the blocks are held against eviction there
        (`BlockManager.hold_prefix`), read out without it, and released under it again. A held
        block is a registered one: its K/V was computed before it was registered and nothing
        writes it while it is referenced."""
        if lock is None:
            where = self.bm.held_prefix(token_ids, start_block, max_blocks)
            if where and self._flush_host is not None and any(not g for g, _ in where):
                self._flush_host()
            return len(where), self._read_frames(where, max_frame_bytes)
        with lock:
            where = self.bm.hold_prefix(token_ids, start_block, max_blocks)
            if not where:
                return 0, []
            host = any(not on_gpu for on_gpu, _ in where)
            if host and self._flush_host is not None:
                self._flush_host()
            ready = None
            if self.device.type == "cuda":  # after every write queued so far (steps in flight)
                ready = torch.cuda.Event()
                ready.record(self._main_stream)
        try:
            if ready is None:
                return len(where), self._read_frames(where, max_frame_bytes)
            if host:  # the tier's own copies run on its stream
                torch.cuda.synchronize(self.device)
            if self._side_stream is None:
                self._side_stream = torch.cuda.Stream(self.device)
            self._side_stream.wait_event(ready)
            with torch.cuda.stream(self._side_stream):
                return len(where), self._read_frames(where, max_frame_bytes)
        finally:
            with lock:
                self.bm.release_prefix(where)

    def export_ipc(self, token_ids: Sequence[int], start_block: int, max_blocks: int,
                   lock) -> tuple[list[tuple[bool, int]], bytes] | None:
        """Hold the prompt's blocks from `start_block` for a puller that maps them (CUDA IPC):
        (where they are, an interprocess event after the writes queued so far); the caller
        releases them (`release`) when the puller says so or its lease ends. None: not
        answerable this way (no CUDA, or some blocks are on the host tier): answer with frames."""
        if not cuda_ipc.available(self.device) or lock is None:
            return None
        with lock:
            where = self.bm.hold_prefix(token_ids, start_block, max_blocks)
            if where and any(not on_gpu for on_gpu, _ in where):
                self.bm.release_prefix(where)
                return None
            event = cuda_ipc.record_event(self._main_stream) if where else b""
        return where, event

    def release(self, where: list[tuple[bool, int]], lock=None) -> None:
        """Let blocks held by `export_ipc` go (they may be evicted again). `lock` None: the
        caller owns the block manager (the loop's thread, or nobody else is running)."""
        if lock is None:
            self.bm.release_prefix(where)
            return
        with lock:
            self.bm.release_prefix(where)

    def import_ipc(self, token_ids: Sequence[int], start_block: int, num_blocks: int,
                   peer_tensors: Sequence[torch.Tensor], peer_block_ids: Sequence[int]) -> int:
        """Copy `num_blocks` blocks from a peer's mapped block tensors (its `tensors`, in order,
        each [num_blocks, ...]) into fresh blocks registered in the prefix cache, on the GPU;
        returns the prompt tokens they cover (0: no room, nothing taken). Returns once the
        copies are done (the peer may then release its blocks)."""
        if len(peer_tensors) != len(self.tensors) or any(
                p.shape[1:] != t.shape[1:] or p.dtype != t.dtype
                for p, t in zip(peer_tensors, self.tensors)):
            raise PullError("the peer's mapped block tensors do not match ours")
        if num_blocks <= 0 or not self.bm.can_import(token_ids, num_blocks):
            return 0
        limit = min(p.shape[0] for p in peer_tensors)
        if any(not 0 <= b < limit for b in peer_block_ids[:num_blocks]):
            raise PullError("the peer named a block outside its pools")
        blocks = self.bm.import_prefix(token_ids, start_block, num_blocks)
        keep = [j for j, b in enumerate(blocks) if b >= 0]
        if keep:
            src_dev = peer_tensors[0].device
            src = torch.tensor([peer_block_ids[j] for j in keep], dtype=torch.long, device=src_dev)
            dst = torch.tensor([blocks[j] for j in keep], dtype=torch.long, device=self.device)
            for p, t in zip(peer_tensors, self.tensors):
                rows = p.index_select(0, src)
                t.index_copy_(0, dst, rows if rows.device == t.device else rows.to(t.device))
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
        return num_blocks * self.block_size

    def _read_frames(self, where: list[tuple[bool, int]], max_frame_bytes: int) -> list:
        per_frame = max(1, max_frame_bytes // self.block_bytes)
        return [self._read(where[i:i + per_frame]) for i in range(0, len(where), per_frame)]

    def _read(self, where: list[tuple[bool, int]]) -> np.ndarray:
        if all(on_gpu for on_gpu, _ in where):  # the common case: one gather, one copy out
            ids = torch.tensor([b for _, b in where], dtype=torch.long, device=self.device)
            stage = torch.empty((len(where), self.block_bytes), dtype=torch.uint8,
                                device=self.device)
            self.gather.gather(ids, stage)
            return stage.cpu().numpy()
        rows = torch.empty((len(where), self.block_bytes), dtype=torch.uint8)
        gpu = [(i, b) for i, (on_gpu, b) in enumerate(where) if on_gpu]
        if gpu:
            ids = torch.tensor([b for _, b in gpu], dtype=torch.long, device=self.device)
            stage = torch.empty((len(gpu), self.block_bytes), dtype=torch.uint8, device=self.device)
            self.gather.gather(ids, stage)
            rows[[i for i, _ in gpu]] = stage.cpu()
        host = [(i, b) for i, (on_gpu, b) in enumerate(where) if not on_gpu]
        if host:
            rows[[i for i, _ in host]] = self.host_kv.host_blocks[[b for _, b in host]]
        return rows.numpy()

    # ---- the puller: write blocks in ----------------------------------------------------------
    def num_local_blocks(self, token_ids: Sequence[int]) -> int:
        """Leading full blocks of the prompt this backend holds on the GPU (a pull starts after)."""
        return len(self.bm.match_prefix(token_ids)[0])

    def import_(self, token_ids: Sequence[int], start_block: int, num_blocks: int,
                frames: Sequence) -> int:
        """Write `num_blocks` pulled blocks (raw frames, validated by `check_reply`) into fresh
        blocks registered in the prefix cache; returns the prompt tokens they cover (0: no room,
        nothing taken)."""
        if num_blocks <= 0 or not self.bm.can_import(token_ids, num_blocks):
            return 0
        blocks = self.bm.import_prefix(token_ids, start_block, num_blocks)
        i = 0
        for frame in frames:
            rows = np.frombuffer(frame, dtype=np.uint8).reshape(-1, self.block_bytes)
            ids = blocks[i:i + len(rows)]
            i += len(rows)
            keep = [j for j, b in enumerate(ids) if b >= 0]
            if not keep:
                continue
            if len(keep) == len(rows) and self.device.type != "cpu":
                # straight from the frame's (read-only) buffer to the device: no host copy
                with warnings.catch_warnings():  # read-only: torch only reads it here
                    warnings.simplefilter("ignore")
                    src = torch.frombuffer(frame, dtype=torch.uint8).view(len(rows), -1)
            else:
                src = torch.from_numpy(rows[keep])  # a copy: the frame's buffer is read-only
            dst = torch.tensor([ids[j] for j in keep], dtype=torch.long, device=self.device)
            self.gather.scatter(dst, src.to(self.device))
        return num_blocks * self.block_size


# ---- messages -------------------------------------------------------------------------------
def make_pull(pull_id: int, start_block: int, layout: str, max_blocks: int = 0) -> pb.Envelope:
    return pb.Envelope(kv_pull=pb.KvPull(pull_id=pull_id, prompt_frame=0,
                                         start_block=start_block, max_blocks=max_blocks,
                                         layout=layout))


def answer_pull(port: KVPort | None, pull: pb.KvPull, prompt: np.ndarray | None,
                checksum: bool = True, lock=None) -> list:
    """The frames answering one KvPull (envelope first): the blocks, or an explicit error.
    `lock`: answered off the serving loop (`KVPort.export`)."""
    reply = pb.KvBlocks(pull_id=pull.pull_id, start_block=pull.start_block)
    data: list[np.ndarray] = []
    if port is None:
        reply.error = "this backend keeps no prefix cache to pull from"
    elif pull.layout != port.layout:
        reply.layout = port.layout
        reply.error = f"KV layout differs: peer stores {port.layout!r}, puller {pull.layout!r}"
    elif prompt is None or len(prompt) == 0:
        reply.error = "pull names no prompt"
    else:
        reply.layout = port.layout
        n, data = port.export(prompt.tolist(), pull.start_block, pull.max_blocks, lock=lock)
        if n == 0:
            reply.error = "prefix not held (evicted, or never here)"
        reply.num_blocks, reply.block_bytes = n, port.block_bytes
        reply.first_frame, reply.num_frames = 0, len(data)
        if checksum:
            reply.frame_crc32.extend(zlib.crc32(memoryview(f)) for f in data)
    return [pb.Envelope(kv_blocks=reply).SerializeToString(), *(memoryview(f) for f in data)]


def answer_pull_ipc(port: KVPort | None, pull: pb.KvPull, prompt: np.ndarray | None,
                    lock) -> tuple[list, list[tuple[bool, int]]] | None:
    """The frames answering a KvPull by CUDA IPC (block ids, the pools' handles, an event) and
    the blocks held for it (release them on the puller's KvRelease or at its lease's end); None
    when it is not answerable that way (`answer_pull` then answers with frames)."""
    if (port is None or not pull.ipc or pull.layout != port.layout or prompt is None
            or len(prompt) == 0):
        return None
    held = port.export_ipc(prompt.tolist(), pull.start_block, pull.max_blocks, lock)
    if held is None:
        return None
    where, event = held
    if not where:
        return None  # answered by `answer_pull`: its explicit "prefix not held"
    try:
        reply = pb.KvBlocks(pull_id=pull.pull_id, start_block=pull.start_block,
                            num_blocks=len(where), block_bytes=port.block_bytes,
                            layout=port.layout, ipc_block_ids=[b for _, b in where],
                            ipc_event=event, ipc_pools=cuda_ipc.share(port.tensors))
    except Exception:
        port.release(where, lock)
        raise
    return [pb.Envelope(kv_blocks=reply).SerializeToString()], where


class PullError(ValueError):
    """A KvBlocks reply that cannot be used (the pull then falls back to recompute)."""


def _reply_envelope(frames: Sequence) -> pb.Envelope:
    """A pull reply's envelope (frame 0), or `PullError`."""
    if not frames:
        raise PullError("empty reply")
    try:
        return codec.decode(frames[:1]).envelope
    except codec.DecodeError as exc:
        raise PullError(f"garbled reply: {exc}") from None


def _check_header(r: pb.KvBlocks, layout: str, block_bytes: int, start_block: int,
                  max_blocks: int) -> None:
    """What every KvBlocks answer must say, frames or CUDA IPC (`PullError` naming what not)."""
    if r.error:
        raise PullError(f"peer: {r.error}")
    if r.layout != layout:
        raise PullError(f"reply layout {r.layout!r} is not ours ({layout!r})")
    if r.block_bytes != block_bytes or r.start_block != start_block:
        raise PullError(f"reply block_bytes/start_block {r.block_bytes}/{r.start_block}, want "
                        f"{block_bytes}/{start_block}")
    if not 0 < r.num_blocks <= max_blocks:
        raise PullError(f"reply has {r.num_blocks} blocks, at most {max_blocks} possible")


def check_ipc_reply(frames: Sequence, layout: str, block_bytes: int, start_block: int,
                    max_blocks: int) -> pb.KvBlocks | None:
    """The header of a KvBlocks answered by CUDA IPC, checked (`PullError` naming what is wrong);
    None when the reply is not an IPC one (`check_reply` reads it)."""
    env = _reply_envelope(frames)
    if env.WhichOneof("body") != "kv_blocks" or not env.kv_blocks.ipc_block_ids:
        return None
    r = env.kv_blocks
    _check_header(r, layout, block_bytes, start_block, max_blocks)
    if len(r.ipc_block_ids) != r.num_blocks:
        raise PullError(f"IPC reply names {len(r.ipc_block_ids)} blocks for {r.num_blocks}")
    if r.num_frames or len(frames) != 1:
        raise PullError("an IPC reply carries no data frames")
    if not r.ipc_pools:
        raise PullError("an IPC reply without the peer's pools")
    return r


def check_reply(frames: Sequence, layout: str, block_bytes: int, start_block: int,
                max_blocks: int) -> tuple[pb.KvBlocks, list[memoryview]]:
    """Parse and check a KvBlocks message: (its header, its data frames); `PullError` naming the
    first thing wrong. Nothing is trusted: sizes, counts, layout and checksums are all checked."""
    env = _reply_envelope(frames)
    if env.WhichOneof("body") == "error":
        raise PullError(f"peer answered with an error: {env.error.message}")
    if env.WhichOneof("body") != "kv_blocks":
        raise PullError(f"peer answered a pull with {env.WhichOneof('body')}")
    r = env.kv_blocks
    _check_header(r, layout, block_bytes, start_block, max_blocks)
    data = [memoryview(f).cast("B") for f in frames[1 + r.first_frame:]]
    if r.first_frame != 0 or len(data) != r.num_frames or len(frames) != 1 + r.num_frames:
        raise PullError(f"reply says {r.num_frames} frames at {r.first_frame}, has {len(frames) - 1}")
    if any(f.nbytes % block_bytes or f.nbytes == 0 for f in data) or \
            sum(f.nbytes for f in data) != r.num_blocks * block_bytes:
        raise PullError(f"reply frames ({[f.nbytes for f in data]} bytes) do not hold "
                        f"{r.num_blocks} blocks of {block_bytes} bytes")
    if r.frame_crc32:
        if len(r.frame_crc32) != len(data):
            raise PullError("reply checksums do not match its frames")
        for i, (f, crc) in enumerate(zip(data, r.frame_crc32)):
            if zlib.crc32(f) != crc:
                raise PullError(f"reply frame {i}: checksum mismatch")
    return r, data


# ---- moving the bytes -----------------------------------------------------------------------
class KVTransport(ABC):
    """How pull messages reach a peer and replies come back. The worker polls `sockets()` with
    its own socket and calls `receive()` when one is readable; nothing blocks."""

    @abstractmethod
    def send(self, endpoint: str, frames: list) -> bool:
        """Queue one message to the peer at `endpoint`; False when it cannot be queued now."""

    @abstractmethod
    def receive(self) -> list[tuple[str, list]]:
        """Every reply that has arrived: (endpoint, frames)."""

    @abstractmethod
    def sockets(self) -> list:
        """What the worker's poller waits on (zmq sockets or file descriptors)."""

    @abstractmethod
    def forget(self, endpoint: str) -> None:
        """Drop the connection to a peer that failed (queued messages go with it)."""

    def close(self) -> None:
        for endpoint in list(self.endpoints()):
            self.forget(endpoint)

    def endpoints(self) -> list[str]:
        return []


class ZmqKVTransport(KVTransport):
    """One DEALER per peer backend, to its ROUTER (the socket gateways talk to)."""

    def __init__(self, ctx: zmq.Context | None = None, security=None) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.security = security  # proto.security.CurveKeys: this backend as a CURVE client
        self._socks: dict[str, zmq.Socket] = {}

    def _socket(self, endpoint: str) -> zmq.Socket:
        sock = self._socks.get(endpoint)
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, codec.MAX_FRAME_BYTES)
            if self.security is not None and endpoint.startswith("tcp://"):
                self.security.apply_client(sock)
            sock.connect(endpoint)
            self._socks[endpoint] = sock
        return sock

    def send(self, endpoint: str, frames: list) -> bool:
        try:
            self._socket(endpoint).send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False

    def receive(self) -> list[tuple[str, list]]:
        out = []
        for endpoint, sock in list(self._socks.items()):
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                except zmq.ZMQError:  # e.g. a message over MAXMSGSIZE: the peer is dropped
                    break
                out.append((endpoint, [f.buffer for f in frames]))
        return out

    def sockets(self) -> list:
        return list(self._socks.values())

    def forget(self, endpoint: str) -> None:
        sock = self._socks.pop(endpoint, None)
        if sock is not None:
            sock.close(linger=0)

    def endpoints(self) -> list[str]:
        return list(self._socks)
