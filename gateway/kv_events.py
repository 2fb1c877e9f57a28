"""Read a backend's KV cache events in vLLM's format and keep its prefix index (issue 33).

vLLM publishes, with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`, one ZeroMQ PUB message per
batch of cache changes: ``[topic, seq (8 bytes big-endian), msgpack(batch)]``; a tidegate backend
with `--kv-events-endpoint` publishes the same (backend.server.kv_events has the format's
details). This module is the gateway's side, written from vLLM's documented format, not from our
publisher:

    decode_batch(payload)   msgpack -> (ts, [KVEvent], dp_rank). The batch is a positional array
                            ([ts, events] or [ts, events, dp_rank]; a map is accepted too); each
                            event a tagged map ({"type": "BlockStored", ...}, vLLM since PR
                            #42892) or a tagged positional array (earlier vLLM).
    KVEventMirror           one backend's blocks from its events: held engine block hashes (per
                            medium), and for each the chain hash *tidegate* gives the same tokens
                            (scheduler.prefix_index: hash((parent chain hash, block tokens)) with
                            the gateway's block size, re-chunked when the engine's differs), so the
                            gateway's prefix lookups match a vLLM backend's blocks. `prefix_hashes()`
                            is what a LoadReport's prefix_hashes would say: the held sampled-depth
                            hashes, for `PrefixIndex.report`.
    KVEventSubscriber       the SUB socket (and REQ to the replay endpoint): a gap in the
                            sequence numbers is filled by replay (or, without one, the mirror is
                            marked stale until the publisher's next AllBlocksCleared); a sequence
                            that starts over (the publisher restarted) clears the mirror.

`tidegate serve --backend http://HOST:8000 --kv-events-from http://HOST:8000=tcp://HOST:5557`
gives an HTTP (vLLM) backend's LoadReports these facts (gateway.http_backend), so `prefix`
placement routes by what the server actually holds instead of by its own guesses.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from scheduler.block_manager import ROOT_HASH
from scheduler.prefix_index import DEPTHS

log = logging.getLogger("tidegate.gateway.kv_events")

END_SEQ = -1


@dataclass
class KVEvent:
    """One decoded event. kind: "BlockStored" | "BlockRemoved" | "AllBlocksCleared"."""
    kind: str
    block_hashes: list = None  # ints (or bytes, vLLM's ExternalBlockHash) as sent
    parent_block_hash: object = None
    token_ids: list = None
    block_size: int = 0
    medium: str | None = None
    group_idx: int | None = None


_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name", "extra_keys", "group_idx")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class KVEventFormatError(ValueError):
    pass


def _event(raw) -> KVEvent:
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = raw
    elif isinstance(raw, (list, tuple)) and raw:
        tag = raw[0]
        names = (_STORED_FIELDS if tag == "BlockStored" else
                 _REMOVED_FIELDS if tag == "BlockRemoved" else ())
        fields = dict(zip(names, raw[1:]))
    else:
        raise KVEventFormatError(f"an event is a tagged map or array, got {type(raw).__name__}")
    if tag == "BlockStored":
        try:
            hashes, tokens, bs = fields["block_hashes"], fields["token_ids"], fields["block_size"]
        except KeyError as exc:
            raise KVEventFormatError(f"BlockStored without {exc}") from None
        if not isinstance(bs, int) or bs < 1 or len(tokens) != bs * len(hashes):
            raise KVEventFormatError(f"BlockStored: {len(tokens)} tokens for {len(hashes)} "
                                     f"blocks of {bs}")
        return KVEvent("BlockStored", list(hashes), fields.get("parent_block_hash"), list(tokens),
                       bs, fields.get("medium"), fields.get("group_idx"))
    if tag == "BlockRemoved":
        if "block_hashes" not in fields:
            raise KVEventFormatError("BlockRemoved without block_hashes")
        return KVEvent("BlockRemoved", list(fields["block_hashes"]), medium=fields.get("medium"),
                       group_idx=fields.get("group_idx"))
    if tag == "AllBlocksCleared":
        return KVEvent("AllBlocksCleared")
    raise KVEventFormatError(f"unknown event type {tag!r}")


def decode_batch(payload: bytes) -> tuple[float, list[KVEvent], int | None]:
    """A batch's msgpack -> (ts, events, data_parallel_rank or None)."""
    import msgpack  # the optional `kv-events` extra (pyproject.toml)

    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise KVEventFormatError(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, dp = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, (list, tuple)) and len(raw) >= 2:
        ts, events, dp = raw[0], raw[1], (raw[2] if len(raw) > 2 else None)
    else:
        raise KVEventFormatError("a batch is [ts, events, dp_rank]")
    if not isinstance(events, (list, tuple)):
        raise KVEventFormatError("a batch's events are a list")
    return float(ts or 0.0), [_event(e) for e in events], dp


class KVEventMirror:
    """One backend's cached blocks as its events describe them (module doc).

    For each held engine block: its media, and its place in tidegate's chain at the gateway's
    `block_size`: ``(chain hash at the last whole gateway block, gateway blocks so far, tokens
    past it)``. With equal block sizes a block completes exactly one gateway block and, for a
    tidegate backend, its gateway chain hash is its own block hash. A block whose parent is
    neither held nor remembered (`remember` recently removed blocks) has no place: it counts as
    held but gives no prefix hash.

    vLLM does not de-duplicate its cache: a prefix computed by two requests at once is cached in
    two blocks, each announced by a BlockStored and withdrawn by a BlockRemoved. So stores and
    removals of a hash are counted per medium; it is held while more were stored than removed
    (a tidegate backend keeps one block per key: its counts are 0 or 1)."""

    def __init__(self, block_size: int, depths: Sequence[int] = DEPTHS,
                 remember: int = 65536) -> None:
        self.block_size = block_size
        self.depths = frozenset(depths)
        self.remember = remember
        self.media: dict[object, set[str]] = {}  # held engine hash -> media holding it
        self._copies: dict[tuple, int] = {}      # (held hash, medium) -> blocks holding it
        self.blocks: dict[object, tuple] = {}    # held engine hash -> (parent, tokens, place,
        #                                         (gateway blocks it completes: (k, chain), ...))
        self._gone: OrderedDict[object, tuple] = OrderedDict()  # removed, recently: same
        self._prefix: dict[int, int] = {}  # sampled-depth gateway chain hash -> held blocks
        self.num_events = 0
        self.num_unplaced = 0  # stored blocks whose parent was unknown
        self.stale = False  # a gap could not be filled: the picture may miss changes

    # ---- applying events -----------------------------------------------------------------------
    def apply(self, events: Sequence[KVEvent]) -> None:
        for ev in events:
            self.num_events += 1
            if ev.kind == "BlockStored":
                self._stored(ev)
            elif ev.kind == "BlockRemoved":
                medium = ev.medium or "GPU"
                for h in ev.block_hashes:
                    self._removed(h, medium)
            else:
                self.clear()

    def clear(self) -> None:
        self.media.clear()
        self._copies.clear()
        self.blocks.clear()
        self._gone.clear()
        self._prefix.clear()
        self.stale = False

    def _place_of(self, h) -> tuple | None:
        info = self.blocks.get(h)
        if info is None:
            info = self._gone.get(h)
        return None if info is None else info[2]

    def _stored(self, ev: KVEvent) -> None:
        bs_e, bs_g, medium = ev.block_size, self.block_size, ev.medium or "GPU"
        parent = ev.parent_block_hash
        place = (ROOT_HASH, 0, ()) if parent is None else self._place_of(parent)
        for i, h in enumerate(ev.block_hashes):
            tokens = tuple(ev.token_ids[i * bs_e:(i + 1) * bs_e])
            done: tuple = ()
            if place is None:
                self.num_unplaced += 1
            else:
                chain, k, carry = place
                carry = carry + tokens
                while len(carry) >= bs_g:
                    chain = hash((chain, carry[:bs_g]))
                    k += 1
                    done += ((k, chain),)
                    carry = carry[bs_g:]
                place = (chain, k, carry)
            copies = self._copies
            copies[h, medium] = copies.get((h, medium), 0) + 1
            held = self.media.get(h)
            if held is None:
                self.media[h] = {medium}
                self.blocks[h] = (parent, tokens, place, done)
                self._gone.pop(h, None)
                for k, chain in done:
                    if k in self.depths:
                        self._prefix[chain] = self._prefix.get(chain, 0) + 1
            else:
                held.add(medium)
            parent = h

    def _removed(self, h, medium: str) -> None:
        n = self._copies.get((h, medium))
        if n is None:
            return
        if n > 1:
            self._copies[h, medium] = n - 1
            return
        del self._copies[h, medium]
        held = self.media[h]
        held.discard(medium)
        if held:
            return
        del self.media[h]
        info = self.blocks.pop(h)
        for k, chain in info[3]:
            if k in self.depths:
                n = self._prefix[chain] - 1
                if n:
                    self._prefix[chain] = n
                else:
                    del self._prefix[chain]
        gone = self._gone
        gone[h] = info
        if len(gone) > self.remember:
            gone.popitem(last=False)

    # ---- reading -------------------------------------------------------------------------------
    def holds(self, h, medium: str | None = None) -> bool:
        held = self.media.get(h)
        return held is not None and (medium is None or medium in held)

    def block_hashes(self, medium: str | None = None) -> set:
        return {h for h, m in self.media.items() if medium is None or medium in m}

    def prefix_hashes(self) -> list[int]:
        """The held sampled-depth chain hashes (tidegate's, at the gateway's block size)."""
        return list(self._prefix)


class KVEventSubscriber:
    """Follow one publisher: SUB to `endpoint` (topic prefix `topic`), replay from
    `replay_endpoint` on a gap, apply every batch to `mirror` in sequence order. Run `run()` as
    an asyncio task; cancel it to stop."""

    def __init__(self, endpoint: str, mirror: KVEventMirror, replay_endpoint: str | None = None,
                 topic: str = "", ctx: zmq.asyncio.Context | None = None,
                 replay_timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.mirror = mirror
        self.ctx = ctx or zmq.asyncio.Context.instance()
        self.replay_timeout_s = replay_timeout_s
        self.last_seq = -1
        self.num_batches = 0
        self.num_replayed = 0
        self.num_gaps = 0        # gaps seen
        self.num_bad = 0         # messages that did not decode (skipped)
        self.num_restarts = 0    # sequences that started over
        self.ready = asyncio.Event()  # set once the SUB socket is connected

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            _, events, _ = decode_batch(payload)
        except KVEventFormatError as exc:
            self.num_bad += 1
            log.warning("kv events from %s: seq %d: %s", self.endpoint, seq, exc)
            events = []
        self.mirror.apply(events)
        self.last_seq = seq
        self.num_batches += 1

    async def _replay(self, upto: int) -> bool:
        """Fetch batches last_seq+1 .. upto-1 from the replay endpoint; False when they could
        not all be had."""
        if not self.replay_endpoint:
            return False
        # a DEALER, not vLLM's example's REQ: one request gets many replies (REQ takes one)
        req = self.ctx.socket(zmq.DEALER)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(self.replay_endpoint)
        try:
            await req.send_multipart((b"", (self.last_seq + 1).to_bytes(8, "big")))
            while True:
                if not await req.poll(self.replay_timeout_s * 1000):
                    return False
                frames = await req.recv_multipart()
                # [b"", topic, seq, payload] (vLLM 0.32) or [b"", seq, payload] (earlier)
                if len(frames) not in (3, 4) or len(frames[-2]) != 8:
                    return False
                seq_bytes, payload = frames[-2], frames[-1]
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_SEQ or not payload:
                    return self.last_seq >= upto - 1
                if seq == self.last_seq + 1 and seq < upto:
                    self._apply(seq, payload)
                    self.num_replayed += 1
        finally:
            req.close()

    async def on_message(self, seq: int, payload: bytes) -> None:
        if seq <= self.last_seq:  # the publisher started over: its cache did too
            self.num_restarts += 1
            self.mirror.clear()
            self.last_seq = seq - 1
        elif self.last_seq >= 0 and seq > self.last_seq + 1 or self.last_seq < 0 and seq > 0:
            self.num_gaps += 1
            if not await self._replay(seq):
                self.mirror.stale = True  # until an AllBlocksCleared starts a fresh picture
                log.warning("kv events from %s: batches %d..%d lost", self.endpoint,
                            self.last_seq + 1, seq - 1)
                self.last_seq = seq - 1
        self._apply(seq, payload)

    async def run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.endpoint)
        self.ready.set()
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.num_bad += 1
                    continue
                await self.on_message(int.from_bytes(frames[1], "big"), frames[2])
        finally:
            sub.close()


def parse_kv_events_from(spec: str) -> tuple[str, str, str | None]:
    """`--kv-events-from BACKEND=PUB[,REPLAY]` -> (backend address, PUB endpoint, replay)."""
    backend, sep, rest = spec.partition("=")
    if not sep or not backend or not rest:
        raise ValueError(f"--kv-events-from wants BACKEND=tcp://HOST:PORT[,tcp://HOST:PORT], "
                         f"got {spec!r}")
    pub, _, replay = rest.partition(",")
    return backend.rstrip("/"), pub, (replay or None)


class KVEventFacts:
    """Follow one backend's events and hand its held prefix hashes to the pool's placement as
    facts (`placement.report`, what a tidegate backend's LoadReport does), at most every
    `interval_s` and only when they changed. The backend is found by address in the pool; until
    it is there (discovered later, or removed), nothing is reported."""

    def __init__(self, pool, backend: str, endpoint: str, replay_endpoint: str | None = None,
                 topic: str = "", block_size: int = 16, interval_s: float = 0.1) -> None:
        self.pool = pool
        self.backend = backend.rstrip("/")
        self.interval_s = interval_s
        self.mirror = KVEventMirror(block_size)
        self.subscriber = KVEventSubscriber(endpoint, self.mirror, replay_endpoint, topic)
        self.num_reports = 0

    def _report(self, reported: tuple) -> tuple:
        b = next((b for b in self.pool.backends if b.address.rstrip("/") == self.backend), None)
        if b is None or b.pid < 0:
            return (-1, -1)
        state = (b.pid, self.mirror.num_events)
        if state != reported:
            import time

            self.pool.placement.report(b.pid, self.mirror.prefix_hashes(), time.monotonic())
            self.num_reports += 1
        return state

    async def run(self) -> None:
        sub = asyncio.create_task(self.subscriber.run(), name=f"kv-events {self.backend}")
        reported: tuple = (-1, -1)
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                reported = self._report(reported)
        finally:
            sub.cancel()


def kv_events_ctx(specs: list[tuple[str, str, str | None]], topic: str = ""):
    """A cleanup_ctx entry following each `--kv-events-from` backend's events with the app."""
    import contextlib

    from gateway.app_keys import GATEWAY_KEY

    async def ctx(app):
        pool = app[GATEWAY_KEY].pool
        block_size = pool.config.placement.block_size
        tasks = [asyncio.create_task(KVEventFacts(pool, backend, pub, replay, topic,
                                                  block_size).run(), name=f"kv-facts {backend}")
                 for backend, pub, replay in specs]
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return ctx
