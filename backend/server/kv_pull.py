"""The worker's side of prefix pull (issue 34): requests that wait for their prefix blocks from a
peer backend, and the answers to peers' pulls. The bytes and their checks are
`backend.kv.transfer`'s; this module owns the waiting, the deadlines and the counts.

A request whose `GenerateRequest.kv_source` names a peer is *parked* here instead of being
admitted: a `KvPull` goes to the peer for the prompt's blocks after the ones this backend holds.
It leaves the park exactly once, admitted by the worker (`take_ready`), when

    the reply arrives      valid: its blocks join the prefix cache, the request then hits them;
                           invalid (garbage, wrong layout, an explicit peer error, no room):
                           nothing is taken, the request recomputes
    the deadline passes    the peer died or stalls: the request recomputes; a late reply is
                           dropped unread by its unknown pull id, the peer's socket is closed
    it is cancelled        abort, its gateway gone, shutdown: the worker answers it (`cancel*`)

so every request is answered once, and no block is allocated before a whole, valid reply is in
hand. Pulls are never retried: recompute is always available and costs at most the same.

A request can join a step only between two steps. A busy worker that parks one therefore holds
its next step up to `land_wait_s` (`land_wait_ms`, `Worker._await_landing`) when the pull is
expected to land within it (twice its bytes over the measured pull rate, plus a round trip):
the request then joins that step instead of the one after it (a whole step later; 0.3-2 s on a
loaded CPU backend). A peer answers such a pull off its own loop (`backend.server.kv_serve`).
"""
from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass

import numpy as np
import zmq

from backend.kv import cuda_ipc
from backend.kv.transfer import (
    DEFAULT_PULL_TIMEOUT_S,
    KVPort,
    KVTransport,
    PullError,
    ZmqKVTransport,
    answer_pull,
    check_ipc_reply,
    check_reply,
    make_pull,
)
from proto import codec
from proto import tidegate_pb2 as pb
from scheduler.kv_cost import PullConfig

DEFAULT_LAND_WAIT_S = PullConfig.land_wait_s  # the most a busy worker holds its next step
LAND_ROUND_TRIP_S = 0.003   # a pull's fixed cost in that expectation (two messages, a lookup)


@dataclass(slots=True)
class Parked:
    """A request waiting for its pull."""
    identity: bytes
    key: str
    req: pb.GenerateRequest
    prompt: np.ndarray
    prediction: np.ndarray | None
    endpoint: str
    pull_id: int
    start_block: int
    max_blocks: int
    deadline: float
    started: float
    expect_s: float = 0.0  # when it should land, from the measured pull rate (land_wait_ms)
    crossed_step: bool = False  # a step ran while it waited: its elapsed time is not the pull's
    # a valid reply that found no room here yet: (reply, frames) or (reply, the peer's mapped
    # tensors: their blocks lent until we release them); retried after each step (take_ready)
    landing: tuple | None = None
    # the landed blocks, held against eviction until the request is allocated (keep_hold)
    hold: list | None = None


class PrefixPuller:
    def __init__(self, port: KVPort | None, transport: KVTransport | None = None,
                 timeout_s: float = DEFAULT_PULL_TIMEOUT_S, clock=time.monotonic,
                 checksum: bool = True, land_wait_s: float = DEFAULT_LAND_WAIT_S,
                 ipc: bool = False) -> None:
        self.port = port
        # ask peers to answer by CUDA IPC (`backend.kv.cuda_ipc`): only a CUDA backend can map
        # their pages; off again after a mapping fails (a peer on another host, say)
        self.ipc = bool(ipc and port is not None and cuda_ipc.available(port.device))
        self.num_ipc_pulls = 0
        self.land_wait_s = land_wait_s
        self.transport = transport if transport is not None or port is None else ZmqKVTransport()
        self.timeout_s = timeout_s
        self.clock = clock
        self.checksum = checksum
        self._ids = itertools.count(1)
        self._parked: dict[int, Parked] = {}   # pull id -> request
        self._by_key: dict[str, int] = {}      # request key -> pull id
        self._ready: list[Parked] = []
        self._registered: set = set()          # sockets in the worker's poller
        # peers' pulls waiting here for a prefill in flight (KvPull.wait_s): (identity, message,
        # deadline), answered by take_answers once the blocks are all here or at the deadline
        self._deferred: list[tuple[bytes, codec.Decoded, float]] = []
        self.num_pulls = 0
        self.num_failures = 0
        self.num_pulled_tokens = 0
        self.num_served = 0
        self.num_late = 0                      # replies after their deadline (dropped)
        self.num_room_waits = 0                # valid replies that waited for free blocks
        # landed prefixes held for requests not yet allocated: engine key -> held blocks
        self._holds: dict[str, list] = {}
        self.bytes_per_s = 0.0                 # EMA over successful pulls, end to end
        self.land_bytes_per_s = 0.0            # the same over those no step delayed (land_wait_ms)
        self.prefill_tokens_per_s = 0.0        # EMA over mostly-prefill steps (observe_step)
        self.last_error = ""

    def observe_step(self, plan, seconds: float | None) -> None:
        """The recompute side of the gateway's pull decisions: prompt tokens a second over
        steps that are mostly prefill (their decodes count against it a little)."""
        chunks = getattr(plan, "chunks", None)
        if not chunks or not seconds or seconds <= 0:
            return
        num_prefill = sum(len(c.token_ids) for c in chunks if c.is_prefill)
        if num_prefill < 32 or num_prefill < plan.num_batched_tokens // 2:
            return
        rate = plan.num_batched_tokens / seconds
        old = self.prefill_tokens_per_s
        self.prefill_tokens_per_s = rate if not old else 0.8 * old + 0.2 * rate

    # ---- the puller ---------------------------------------------------------------------------
    def park(self, identity: bytes, key: str, req: pb.GenerateRequest, prompt: np.ndarray,
             prediction: np.ndarray | None) -> bool:
        """Start the pull a request asks for; False when there is nothing to pull (no port, the
        prompt's head already here, the pull could not be queued): admit it now."""
        src = req.kv_source
        port = self.port
        if port is None or not src.endpoint or prompt is None or len(prompt) < 2:
            return False
        ids = prompt.tolist()
        start = port.num_local_blocks(ids)
        max_blocks = (len(ids) - 1) // port.block_size - start
        if max_blocks <= 0 or (src.num_tokens and src.num_tokens <= start * port.block_size):
            return False
        pull_id = next(self._ids)
        pull = make_pull(pull_id, start, port.layout, max_blocks)
        pull.kv_pull.wait_s = src.prefill_wait_s  # a disaggregated prefill: wait for it there
        pull.kv_pull.ipc = self.ipc
        frames = codec.encode_trusted(pull, [ids])
        self.num_pulls += 1
        if not self.transport.send(src.endpoint, frames):
            self._fail(f"pull to {src.endpoint} could not be queued")
            return False
        now = self.clock()
        timeout = src.timeout_s if src.timeout_s > 0 else self.timeout_s
        expect = self.land_wait_s if not self.land_bytes_per_s else (
            LAND_ROUND_TRIP_S + 2 * max_blocks * port.block_bytes / self.land_bytes_per_s)
        if src.prefill_wait_s > 0:  # a prefill in flight there: not soon
            expect = float("inf")
        self._parked[pull_id] = Parked(identity, key, req, prompt, prediction, src.endpoint,
                                       pull_id, start, max_blocks, now + timeout, now, expect)
        self._by_key[key] = pull_id
        return True

    def is_parked(self, key: str) -> bool:
        return key in self._by_key

    @property
    def num_parked(self) -> int:
        return len(self._parked)

    @property
    def active(self) -> bool:
        """Whether the worker's loop has anything to do here (pulls waiting, peer sockets
        open: a late or stray reply must be read, or the poller would wake for it forever;
        landed prefixes held for requests not yet allocated)."""
        return bool(self._parked or self._ready or self._registered or self._deferred
                    or self._holds)

    def cancel(self, key: str) -> Parked | None:
        pull_id = self._by_key.pop(key, None)
        p = self._parked.pop(pull_id) if pull_id is not None else None
        if p is not None and p.landing is not None:
            self._end_landing(p)
        return p

    def cancel_identity(self, identity: bytes) -> list[Parked]:
        return [self.cancel(p.key) for p in list(self._parked.values()) if p.identity == identity]

    def cancel_all(self) -> list[Parked]:
        out = list(self._parked.values())
        for p in out:
            if p.landing is not None:
                self._end_landing(p)
        for p in self._ready:
            self.drop_hold(p)
        self.release_holds(lambda key: True)
        self._parked.clear()
        self._by_key.clear()
        out += self._ready
        self._ready = []
        return out

    def wait_ms(self, wait_ms: int) -> int:
        """The worker's poll timeout, shortened to the earliest deadline."""
        if self._ready:
            return 0
        if not self._parked and not self._deferred:
            return wait_ms
        due = min([p.deadline for p in self._parked.values()] +
                  [d for _, _, d in self._deferred])
        return max(0, min(wait_ms, int((due - self.clock()) * 1000) + 1))

    def note_step(self) -> None:
        """A step is about to run: the pulls parked now are delayed by it (their rate is not
        the transfer's)."""
        for p in self._parked.values():
            p.crossed_step = True

    def land_wait_ms(self) -> int:
        """How long a busy worker may still hold its next step for parked pulls expected to land
        within the land wait (module docstring); 0: step now."""
        if not self._parked or self.land_wait_s <= 0:
            return 0
        now = self.clock()
        due = [p.started + p.expect_s for p in self._parked.values()
               if p.expect_s <= self.land_wait_s]
        if not due:
            return 0
        return max(0, int((max(due) - now) * 1000) + 1)

    def sync_poller(self, poller: zmq.Poller) -> None:
        """Register the transport's sockets with the worker's poller (they come and go)."""
        if self.transport is None:
            return
        now = set(self.transport.sockets())
        for s in self._registered - now:
            try:
                poller.unregister(s)
            except KeyError:
                pass
        for s in now - self._registered:
            poller.register(s, zmq.POLLIN)
        self._registered = now

    def take_ready(self) -> list[Parked]:
        """Requests whose pull ended (any way) since the last call: admit each exactly once."""
        if self.transport is not None:
            for endpoint, frames in self.transport.receive():
                self._on_reply(endpoint, frames)
        if any(p.landing is not None for p in self._parked.values()):
            free = self.port.bm.num_free_blocks  # O(1): the import's own check hashes the prompt
            for p in [p for p in self._parked.values()
                      if p.landing is not None and p.landing[0].num_blocks <= free]:
                self._retry_landing(p)  # blocks freed by the step since: room now?
        now = self.clock()
        for p in [p for p in self._parked.values() if p.deadline <= now]:
            if p.landing is not None:  # its reply is here; only the room never came
                message = f"{self._no_room(p.landing[0].num_blocks)} until the deadline"
                self.cancel(p.key)
                self._fail(f"pull from {p.endpoint}: {message}; recomputing")
                self._ready.append(p)
                continue
            self.cancel(p.key)
            self.transport.forget(p.endpoint)  # whatever it sends later is dropped unread
            self._fail(f"pull from {p.endpoint} timed out after {now - p.started:.3f} s; "
                       "recomputing")
            self._ready.append(p)
        ready, self._ready = self._ready, []
        return ready

    def _on_reply(self, endpoint: str, frames: list) -> None:
        try:
            env = codec.decode(frames[:1]).envelope
            pull_id = env.kv_blocks.pull_id if env.WhichOneof("body") == "kv_blocks" else 0
        except codec.DecodeError:
            pull_id = 0
        p = self._parked.get(pull_id)
        if p is None or p.endpoint != endpoint:
            if pull_id == 0:  # garbage or an Error: fail this peer's oldest pull
                p = next((q for q in self._parked.values()
                          if q.endpoint == endpoint and q.landing is None), None)
            if p is None:
                self.num_late += 1
                return
        self.cancel(p.key)
        port = self.port
        try:
            reply = check_ipc_reply(frames, port.layout, port.block_bytes, p.start_block,
                                    p.max_blocks)
            if reply is not None:
                p.landing = (reply, self._map_ipc(endpoint, reply))
            else:
                p.landing = check_reply(frames, port.layout, port.block_bytes, p.start_block,
                                        p.max_blocks)
            tokens = self._land(p)
        except PullError as exc:
            if p.landing is not None:
                self._end_landing(p)
            self._fail(f"pull from {endpoint}: {exc}; recomputing")
            self._ready.append(p)
            return
        if not tokens:
            # No room for the blocks now: running sequences hold it. Recomputing would need
            # the same blocks and then a long prefill among the decoding streams, so the reply
            # waits (the peer's lent blocks stay lent) and lands after a step frees room, or
            # the request recomputes at its deadline (take_ready)
            self.num_room_waits += 1
            print(f"tidegate backend: pull from {endpoint}: "
                  f"{self._no_room(p.landing[0].num_blocks)}; waiting for room until its "
                  f"deadline ({p.deadline - self.clock():.1f} s)", file=sys.stderr)
            p.expect_s = float("inf")  # not worth holding a step for
            self._parked[p.pull_id] = p
            self._by_key[p.key] = p.pull_id
            return
        self._landed(p, tokens, waited=False)

    def _retry_landing(self, p: Parked) -> None:
        try:
            tokens = self._land(p)
        except PullError as exc:
            self.cancel(p.key)
            self._fail(f"pull from {p.endpoint}: {exc}; recomputing")
            self._ready.append(p)
            return
        if tokens:
            self._by_key.pop(p.key, None)
            self._parked.pop(p.pull_id, None)
            self._landed(p, tokens, waited=True)

    def _land(self, p: Parked) -> int:
        """Write a valid reply's blocks into this backend's cache: the prompt tokens they cover;
        0: no room now (nothing taken)."""
        reply, data = p.landing
        if reply.ipc_pools:
            tokens = self.port.import_ipc(p.prompt.tolist(), p.start_block, reply.num_blocks,
                                          data, list(reply.ipc_block_ids))
            if tokens:
                self.num_ipc_pulls += 1
            return tokens
        return self.port.import_(p.prompt.tolist(), p.start_block, reply.num_blocks, data)

    def _landed(self, p: Parked, tokens: int, waited: bool) -> None:
        reply = p.landing[0]
        self._end_landing(p)
        # Held until the request is allocated: on a full backend its queue can be long, and
        # blocks left at reference 0 would be evicted by the requests allocated before it (the
        # H200 split, 2026-12-04 night: 4 of 12 landed 8K prefixes recomputed, 24K tokens)
        p.hold = self.port.bm.hold_prefix(p.prompt.tolist())
        self._ready.append(p)
        if not waited:  # a reply that waited for room says nothing of the link's rate
            elapsed = max(self.clock() - p.started, 1e-6)
            rate = reply.num_blocks * self.port.block_bytes / elapsed
            self.bytes_per_s = rate if not self.bytes_per_s else 0.8 * self.bytes_per_s + 0.2 * rate
            if not p.crossed_step:
                old = self.land_bytes_per_s
                self.land_bytes_per_s = rate if not old else 0.8 * old + 0.2 * rate
        self.num_pulled_tokens += tokens

    # ---- landed prefixes held until their request is allocated --------------------------------
    def keep_hold(self, p: Parked) -> None:
        """The worker admitted `p`: its landed blocks stay held until `release_holds` sees it
        allocated (or gone)."""
        if p.hold:
            self._holds[p.key] = p.hold
        p.hold = None

    def drop_hold(self, p: Parked) -> None:
        """`p` leaves without being admitted (aborted, shut down): its hold goes now."""
        if p.hold:
            self.port.bm.release_prefix(p.hold)
        p.hold = None

    @property
    def num_holds(self) -> int:
        return len(self._holds)

    def release_holds(self, done) -> None:
        """Release the holds of the requests `done(key)` says no longer need them (allocated:
        their sequence references the blocks now; finished, failed or aborted)."""
        for key in [k for k in self._holds if done(k)]:
            self.port.bm.release_prefix(self._holds.pop(key))

    def _no_room(self, num_blocks: int) -> str:
        bm = self.port.bm  # what holds the room: running sequences, pins, peers' reads
        return (f"no room for {num_blocks} pulled blocks ({bm.num_free_blocks} free of "
                f"{bm.num_blocks}: {bm.num_seqs} sequences hold blocks, "
                f"{bm.num_pinned_blocks} pinned, {bm.num_read_held_blocks} read-held)")

    def _map_ipc(self, endpoint: str, reply: pb.KvBlocks) -> list:
        """The peer's lent block tensors, mapped here, after its event (its writes done). A
        mapping that fails releases the blocks and turns IPC off for later pulls."""
        try:
            tensors = cuda_ipc.open_tensors(reply.ipc_pools)
            cuda_ipc.wait_event(reply.ipc_event, self.port.device)
            return tensors
        except Exception as exc:  # noqa: BLE001 -- another host, no peer access, ...
            self.ipc = False
            self._release(endpoint, reply.pull_id)
            raise PullError(f"mapping the peer's pages failed ({exc!r}); pulls from now on "
                            "ask for frames") from None

    def _end_landing(self, p: Parked) -> None:
        """The reply's data is no longer needed: lent blocks go back to the peer (always: it
        holds them until then, or until their lease ends)."""
        reply, _ = p.landing
        p.landing = None
        if reply.ipc_pools:
            self._release(p.endpoint, reply.pull_id)

    def _release(self, endpoint: str, pull_id: int) -> None:
        release = pb.Envelope(kv_release=pb.KvRelease(pull_id=pull_id))
        self.transport.send(endpoint, [release.SerializeToString()])

    def _fail(self, message: str) -> None:
        self.num_failures += 1
        self.last_error = message
        print(f"tidegate backend: {message}", file=sys.stderr)

    # ---- the peer -----------------------------------------------------------------------------
    def serve(self, identity: bytes, msg: codec.Decoded) -> list | None:
        """The frames answering a peer's KvPull (blocks, or an explicit error); None when it
        waits here for a prefill in flight (`take_answers` answers it later)."""
        pull = msg.envelope.kv_pull
        if pull.wait_s > 0 and self.port is not None and not self._complete(msg):
            self._deferred.append((identity, msg, self.clock() + min(pull.wait_s, 600.0)))
            return None
        self.num_served += 1
        return answer_pull(self.port, pull, codec.array_of(msg, pull.prompt_frame), self.checksum)

    def _complete(self, msg: codec.Decoded) -> bool:
        pull = msg.envelope.kv_pull
        prompt = codec.array_of(msg, pull.prompt_frame)
        if prompt is None or not pull.max_blocks:
            return True
        held = self.port.bm.held_prefix(prompt.tolist(), pull.start_block, pull.max_blocks)
        return len(held) >= pull.max_blocks

    def take_answers(self) -> list[tuple[bytes, list]]:
        """(peer identity, frames) of the deferred pulls now answerable: every block here
        (the prefill finished), or their wait is over (what is here then, or an error)."""
        if not self._deferred:
            return []
        now, out, keep = self.clock(), [], []
        for identity, msg, deadline in self._deferred:
            if now >= deadline or self._complete(msg):
                pull = msg.envelope.kv_pull
                self.num_served += 1
                out.append((identity, answer_pull(self.port, pull,
                                                  codec.array_of(msg, pull.prompt_frame),
                                                  self.checksum)))
            else:
                keep.append((identity, msg, deadline))
        self._deferred = keep
        return out

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
