"""KV cache events in vLLM's wire format, published over ZeroMQ (issue 33).

KV-aware routers built for vLLM (llm-d's precise prefix-cache scorer, Dynamo's KV router, vLLM's
router) learn which blocks a backend holds from the events vLLM publishes with
`--kv-events-config`; a tidegate backend started with `--kv-events-endpoint` publishes the same
stream from its block manager (scheduler.block_manager `record_kv_events`), so those routers can
place on it, and the gateway reads vLLM's stream the same way (gateway.kv_events).

The format, from vLLM's `vllm/distributed/kv_events.py` (KVEventBatch, ZmqEventPublisher) and its
documented subscriber (examples/online_serving/kv_events_subscriber.py):

    PUB socket, one 3-frame message per batch:  [topic, seq, payload]
        topic    the configured topic, UTF-8 ("" by default: every subscriber gets it)
        seq      8-byte big-endian unsigned sequence number, 0, 1, 2, ... per publisher
        payload  msgpack of the batch
    batch        [ts, events, data_parallel_rank]   a positional array (msgspec array_like)
        ts       float, time.time() when the batch was made
        events   list of events, in the order the cache changed
    BlockStored      {"type": "BlockStored", "block_hashes": [h, ...], "parent_block_hash": p,
                      "token_ids": [...], "block_size": n, "lora_id": None, "medium": "GPU",
                      "lora_name": None, "extra_keys": [None, ...], "group_idx": 0,
                      "kv_cache_spec_kind": "full_attention"}
                     block_hashes[i]'s parent is block_hashes[i-1], the first's is
                     parent_block_hash (None: the sequence's first block); token_ids holds
                     block_size tokens per block, in order
    BlockRemoved     {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU",
                      "group_idx": 0}
    AllBlocksCleared {"type": "AllBlocksCleared"}

Events are tagged maps since vLLM PR #42892 (2026-06, "switch event structs from array to map
encoding"; the batch stays a positional array: vLLM 0.32's EventBatch is array_like, its
KVCacheEvent is not; tests/test_vllm_kv_events.py decodes our batches with vLLM's own classes).
vLLM 0.32's BlockStored also has `session_id` (default None, so omitted on the wire, as here).
`fmt="array"` writes the earlier positional events (``["BlockStored", block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name]``, ``["BlockRemoved", block_hashes, medium]``,
``["AllBlocksCleared"]``) for consumers not updated since.

Replay (vLLM's `replay_endpoint`): a ROUTER socket; a client (DEALER or REQ) sends the first
sequence number it wants as 8 big-endian bytes and receives ``[topic, seq, payload]`` (the live
stream's frames) for every kept batch from there on, then ``[b"", (-1) as 8 signed big-endian
bytes, b""]``, as vLLM 0.32 does (earlier vLLM sent ``[seq, payload]`` and ``[-1, b""]``; the
gateway's subscriber reads both). The last `buffer_steps` batches are kept.

Block hashes are the block manager's chain hashes (`hash((parent_hash, tokens))`, signed 64-bit)
written as unsigned 64-bit ints, as vLLM's are; a consumer that hashes the tokens itself (llm-d,
Dynamo) needs only token_ids, block_size and the parent links.

Endpoints follow vLLM's rule: an address with ``*`` or ``::`` or an ipc:// / inproc:// address
is bound, any other is connected to (a publisher pushing to a relay).

A publisher thread owns the sockets (ZeroMQ sockets are not thread-safe) and does the encoding:
the engine's thread only swaps the recorded list out (`KVEventPublisher.publish`).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import zmq

from scheduler.block_manager import KV_CLEARED, KV_REMOVED, KV_STORED, ROOT_HASH

logger = logging.getLogger("tidegate.kv_events")

U64 = (1 << 64) - 1
END_SEQ = (-1).to_bytes(8, "big", signed=True)
FORMATS = ("map", "array")


def wire_hash(h: int) -> int:
    """A chain hash as vLLM writes block hashes: unsigned 64-bit."""
    return h & U64


def _block_hash_of(key) -> int:
    return hash(key) & U64


def batch_events(entries: Sequence[tuple], block_size: int, fmt: str = "map") -> list:
    """The block manager's ``(kind, medium, key)`` entries as vLLM events, in order. A run of
    stored blocks of one medium where each block's parent is the one before becomes one
    BlockStored (vLLM stores a request's new blocks so); a run of removals of one medium, one
    BlockRemoved."""
    out: list = []
    i, n = 0, len(entries)
    while i < n:
        kind, medium, key = entries[i]
        if kind == KV_CLEARED:
            out.append({"type": "AllBlocksCleared"} if fmt == "map" else ["AllBlocksCleared"])
            i += 1
            continue
        if kind == KV_REMOVED:
            hashes = [_block_hash_of(key)]
            i += 1
            while i < n and entries[i][0] == KV_REMOVED and entries[i][1] == medium:
                hashes.append(_block_hash_of(entries[i][2]))
                i += 1
            out.append({"type": "BlockRemoved", "block_hashes": hashes, "medium": medium,
                        "group_idx": 0} if fmt == "map"
                       else ["BlockRemoved", hashes, medium])
            continue
        assert kind == KV_STORED, kind
        parent = key[0]
        h = hash(key)
        hashes = [h & U64]
        tokens = list(key[1])
        i += 1
        while i < n:
            k2, m2, key2 = entries[i]
            if k2 != KV_STORED or m2 != medium or key2[0] != h:
                break
            h = hash(key2)
            hashes.append(h & U64)
            tokens += key2[1]
            i += 1
        parent_wire = None if parent == ROOT_HASH else parent & U64
        if fmt == "map":
            out.append({"type": "BlockStored", "block_hashes": hashes,
                        "parent_block_hash": parent_wire, "token_ids": tokens,
                        "block_size": block_size, "lora_id": None, "medium": medium,
                        "lora_name": None, "extra_keys": [None] * len(hashes), "group_idx": 0,
                        "kv_cache_spec_kind": "full_attention"})
        else:
            out.append(["BlockStored", hashes, parent_wire, tokens, block_size, None, medium, None])
    return out


def encode_batch(entries: Sequence[tuple], block_size: int, fmt: str = "map",
                 ts: float | None = None, dp_rank: int = 0) -> bytes:
    import msgpack  # the optional `kv-events` extra (pyproject.toml)

    events = batch_events(entries, block_size, fmt)
    return msgpack.packb([time.time() if ts is None else ts, events, dp_rank], use_bin_type=True)


def binds(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard, IPv6-any or local address, connect to any other."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KVEventPublisher:
    """Publish block-manager entries as vLLM KV event batches (module doc).

    `publish(entries)` is called by the engine's thread after a step with what
    `BlockManager.take_kv_events()` returned; encoding, sending and replay run on the
    publisher's own thread. `close()` sends what is queued (up to a second) and stops."""

    def __init__(self, endpoint: str, block_size: int, replay_endpoint: str | None = None,
                 topic: str = "", fmt: str = "map", buffer_steps: int = 10_000,
                 hwm: int = 100_000, max_queue_size: int = 100_000, dp_rank: int = 0,
                 ctx: zmq.Context | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"kv events format must be one of {FORMATS}, got {fmt!r}")
        import msgpack  # noqa: F401 -- fail at start-up, not in the thread, when it is missing

        self.block_size = block_size
        self.fmt = fmt
        self.dp_rank = dp_rank
        self.topic = topic.encode()
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.num_batches = 0  # sent (the next sequence number)
        self.num_queued = 0  # handed to the thread (the engine's side of num_batches)
        self.num_held = 0  # times the queue was full (the entries went with the next batch)
        self._held: list = []
        ctx = ctx or zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 1000)
        if binds(endpoint):
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint
        self._replay = None
        self.replay_endpoint = None
        if replay_endpoint:
            self._replay = ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, entries: list) -> None:
        """Queue one batch (nothing when `entries` is empty). Never blocks the engine: while the
        queue is full the entries wait here and go out with the next batch (no event is lost,
        a consumer's picture stays exact)."""
        if self._held:
            entries = self._held + entries
            self._held = []
        if not entries:
            return
        try:
            self._queue.put_nowait((time.time(), entries))
            self.num_queued += 1
        except queue.Full:
            self._held = entries
            self.num_held += 1

    def close(self, timeout_s: float = 1.0) -> None:
        if not self._running:
            return
        self._running = False
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # still sending: its sockets are its own (not thread-safe)
            logger.warning("kv events: the publisher thread did not stop in %.1f s", timeout_s)
            return
        self._pub.close()
        if self._replay is not None:
            self._replay.close()

    # ---- the publisher thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                try:
                    self._serve_replay()
                except zmq.ZMQError as exc:
                    logger.warning("kv events replay: %s", exc)
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                if not self._running:
                    return
                continue
            if item is None:
                return
            ts, entries = item
            payload = encode_batch(entries, self.block_size, self.fmt, ts, self.dp_rank)
            seq = self.num_batches
            self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))
            self.num_batches = seq + 1

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("kv events replay: bad request of %d frames", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"),
                                             payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))
