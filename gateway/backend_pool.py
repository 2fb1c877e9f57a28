"""The gateway's backends: one ZMQ DEALER per backend, their health, and the token fan-out.

    BackendPool ── BackendConn(addr) ── DEALER ──► backend ROUTER
                     │ reader task: BackendInfo / LoadReport / StepOutput / Error / Health
                     └ inflight: request_id -> RequestSink (the request's asyncio side)

A backend is *healthy* from its `BackendInfo` until no message arrived from it for
`heartbeat_timeout_s` (backends send a `LoadReport` at least every second). A backend marked
down has its in-flight requests failed at once (never a hang) and gets a fresh `Hello` every
`hello_interval_s`, so a restarted backend rejoins. Malformed messages are dropped and counted.

Split by concern: this module holds the pool's membership, lifecycle, placement and sending;
`gateway.backend_conn` one backend's connection, `gateway.pool_receive` the receiving side (the
token fan-out), `gateway.pool_failover` heartbeats, marking down and re-dispatch.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from gateway.abort_outbox import AbortOutbox

# one backend's connection and a request on its way: re-exported, callers import them from here
from gateway.backend_conn import (
    BackendConn,
    Dispatch,
    RequestSink,
    TokenLogprob,
    error_from_backend,
)
from gateway.errors import APIError, unavailable
from gateway.kv_pull import GatewayPulls, split_prefills
from gateway.pool_failover import PoolFailover
from gateway.pool_receive import PoolReceiver
from proto import codec
from proto import tidegate_pb2 as pb
from proto.security import CurveKeys
from scheduler.placement import PlacementConfig, PlacementItem, prefix_hashes
from scheduler.placements import create_placement
from scheduler.sessions import SessionInfo, chain_hashes, sampled_prefix

__all__ = ["BackendConn", "BackendPool", "Dispatch", "PoolConfig", "RequestSink", "TokenLogprob",
           "error_from_backend"]

log = logging.getLogger("tidegate.gateway.pool")

@dataclass(frozen=True, slots=True)
class PoolConfig:
    # No message for this long: the backend is down. Backends report between steps only, and a
    # CPU step under load can take seconds; a dead process is noticed at once anyway (its
    # connection drops, see _watch_connection), so this window only catches a hung one.
    heartbeat_timeout_s: float = 10.0
    hello_interval_s: float = 0.5  # Hello retry period while a backend is not up
    max_inflight_per_backend: int = 256  # requests the gateway keeps on one backend at most
    placement: PlacementConfig = field(default_factory=PlacementConfig)  # who gets which request
    # for http:// backends (gateway.http_backend): the tokenizer their BackendInfo carries
    # (a tokenizer.bundle.TokenizerBundle; None: a ZMQ backend's is used)
    http_tokenizer: object = None
    name: str = "tidegate-gateway"
    # CURVE for tcp:// backends: our key pair and the backends' public key (proto.security).
    curve: CurveKeys | None = None
    # prefix pull between backends (issue 34, gateway.kv_pull): a scheduler.kv_cost.PullConfig;
    # None: off (a backend recomputes what it lacks)
    kv_pull: object = None



class BackendPool(PoolReceiver, PoolFailover):
    def __init__(self, addresses: list[str], config: PoolConfig = PoolConfig(),
                 on_idle: Callable[[], None] | None = None,
                 on_dropped: Callable[[str], None] | None = None,
                 on_retry: Callable[[int], None] | None = None,
                 on_info: Callable[[int, pb.BackendInfo], None] | None = None) -> None:
        # no address is fine: discovery (gateway.discovery) or the admin endpoint adds them, and
        # until one has introduced itself requests get 503
        self.config = config
        self._ctx = zmq.asyncio.Context()
        self.backends = []
        self.placement = create_placement(config.placement)
        self.pulls = GatewayPulls(config.kv_pull) if config.kv_pull is not None else None
        self._by_pid: dict[int, BackendConn] = {}
        self._next_pid = 0
        self._started = False
        for a in addresses:
            self._register(self._connect(a))
        self._owner: dict[str, BackendConn] = {}
        self._info: pb.BackendInfo | None = None
        self._tasks: list[asyncio.Task] = []
        self._ready = asyncio.Event()
        self._on_idle = on_idle or (lambda: None)
        self._on_dropped = on_dropped or (lambda socket: None)
        self._on_retry = on_retry or (lambda n: None)
        # a backend introduced itself (its pid, its BackendInfo): the dispatcher's wait
        # predictor takes its max_num_seqs (scheduler.admission, WaitPredictor.set_slots)
        self._on_info = on_info or (lambda pid, info: None)
        self.num_retried = 0  # requests re-dispatched after their backend died
        self._nonce = itertools.count(1)
        self._batch_ids = itertools.count(1)  # Batch.batch_id: unique per gateway, never 0
        self.num_dropped = 0
        self.num_gaps = 0  # requests failed because their output sequence had a hole
        self._aborts = AbortOutbox(lambda b: b in self.backends)  # never dropped when full

    def _register(self, b) -> None:
        b.pid, b.placement = self._next_pid, self.placement
        self._next_pid += 1
        self._by_pid[b.pid] = b
        self.backends.append(b)
        self.placement.add_backend(b.pid)
        self.placement.set_accepting(b.pid, False)  # until its BackendInfo arrives

    def _start_backend(self, b) -> None:
        b.io._on_message = self._reader_for(b)
        b.io.start()
        self._hello(b, time.monotonic())
        if b.sock is not None:  # an HTTP backend has no socket to watch
            b.watch_task = asyncio.create_task(self._watch_connection(b),
                                               name=f"pool-watch {b.address}")
            self._tasks.append(b.watch_task)

    # --- membership (admin endpoint) -------------------------------------------------------
    def find(self, address: str):
        return next((b for b in self.backends if b.address == address), None)

    def add_backend(self, address: str):
        """A new backend, placed on from its BackendInfo on (while serving)."""
        if self.find(address) is not None:
            raise ValueError(f"backend {address} is already in the pool")
        b = self._connect(address)
        self._register(b)
        if self._started:
            self._start_backend(b)
        log.info("backend %s added", address)
        return b

    def drain_backend(self, address: str) -> None:
        """Take no new requests there; the backend leaves when its last request finishes."""
        b = self.find(address)
        if b is None:
            raise KeyError(address)
        b.draining = True
        self._update_accepting(b)
        log.info("backend %s draining (%d requests left)", address, b.num_inflight)
        if not b.inflight:
            self._leave_soon(b)

    def remove_backend(self, address: str) -> None:
        """Out now: requests not yet started there go to another backend (once), those that
        streamed tokens fail (as when a backend dies)."""
        b = self.find(address)
        if b is None:
            raise KeyError(address)
        b.draining = True
        self._update_accepting(b)
        self._evacuate(b, "removed by the operator")
        self._leave(b)

    def _leave_soon(self, b) -> None:
        # not while a caller iterates the pool's backends
        asyncio.get_running_loop().call_soon(self._leave, b)

    def _leave(self, b) -> None:
        if b not in self.backends:
            return
        self.backends.remove(b)
        self._by_pid.pop(b.pid, None)
        self.placement.remove_backend(b.pid)
        self._info = None
        b.io.stop()
        task = getattr(b, "watch_task", None)
        if task is not None:
            task.cancel()
        if b.sock is not None:
            b.sock.close(linger=0)
        log.info("backend %s left the pool", b.address)

    def _connect(self, address: str):
        """A ZMQ backend (tcp://, ipc://) or an OpenAI-compatible server (http://, https://)."""
        if address.startswith(("http://", "https://")):
            from gateway.http_backend import HttpBackendConn
            return HttpBackendConn(address, self.config.http_tokenizer)
        return BackendConn(address, self._ctx, self.config.curve)

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        self._started = True
        for b in self.backends:
            self._start_backend(b)
        self._tasks.append(asyncio.create_task(self._monitor(), name="pool-monitor"))

    async def close(self) -> None:
        self._aborts.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for b in self.backends:
            b.io.stop()
            self._fail_all(b, unavailable("The gateway is shutting down."))
            if b.sock is not None:
                b.sock.close(linger=0)
        self._ctx.destroy(linger=0)

    async def wait_ready(self, timeout: float) -> bool:
        """True once some backend has sent its BackendInfo (within `timeout` seconds)."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    # --- state ----------------------------------------------------------------------------------
    @property
    def info(self) -> pb.BackendInfo | None:
        """The BackendInfo of the first backend that answered (all serve one model), one that
        carries a tokenizer first (an HTTP backend may have none to give)."""
        info = self._info
        if info is None:  # cached once known: read several times per request
            infos = [b.info for b in self.backends if b.info is not None]
            info = self._info = next((i for i in infos if i.tokenizer_json),
                                     infos[0] if infos else None)
        return info

    def healthy_backends(self) -> list[BackendConn]:
        return [b for b in self.backends if b.healthy]

    def has_idle_backend(self) -> bool:
        """Some healthy backend holds none of this gateway's requests."""
        for b in self.backends:
            if b.healthy and not b.inflight and not b.draining:
                return True
        return False

    def free_slots(self) -> int:
        cap = self.config.max_inflight_per_backend
        return sum(max(0, cap - b.num_inflight) for b in self.healthy_backends()
                   if not b.draining)

    def place(self, items: list[Dispatch], now: float) -> tuple[list[tuple[BackendConn, list[Dispatch]]],
                                                                list[Dispatch]]:
        """Split a flushed window over the backends with the placement policy: ([(backend, its
        requests)], requests no backend accepts). Each pick is O(log backends)."""
        policy = self.placement
        info = self.info
        hashing = policy.config.uses_prefixes and info is not None
        block_size = info.block_size if hashing else 0
        if hashing and hasattr(policy, "sessions"):  # agent sessions (scheduler.sessions)
            placed = [self._session_item(d, block_size, now) for d in items]
        else:
            placed = [PlacementItem(len(d.prompt_ids) + d.sampling.max_tokens,
                                    prefix_hashes(d.prompt_ids, block_size) if hashing else (), d,
                                    None, d.queue_class, len(d.prompt_ids))
                      for d in items]
        policy.place(placed, now)
        parts: dict[int, list[Dispatch]] = {}
        if self.pulls is not None and hashing:  # issue 34: pull what a peer holds, if cheaper
            self.pulls.plan(policy, placed, now, lambda pid: self._by_pid[pid].address)
            prefill = [b for b in self.healthy_backends() if not b.draining and b.info is not None
                       and b.info.role == pb.BackendInfo.PREFILL]
            for p, pd in split_prefills(self.pulls, placed, prefill, Dispatch):
                parts.setdefault(p.pid, []).append(pd)  # then its decode backend pulls it
        unplaced: list[Dispatch] = []
        for it in placed:
            d = it.payload
            if it.backend < 0:
                unplaced.append(d)
                continue
            d.charged_left = it.charged
            parts.setdefault(it.backend, []).append(d)
        return [(self._by_pid[b], ds) for b, ds in parts.items()], unplaced

    @staticmethod
    def _session_item(d: Dispatch, block_size: int, now: float) -> PlacementItem:
        """A placement item with the request's session: its key, its prompt's chain hashes (the
        sampled prefix is part of them) and its pin."""
        opts = getattr(d.sink, "options", None)
        chain = chain_hashes(d.prompt_ids, block_size)
        pin_blocks, until = 0, 0.0
        if opts is not None and opts.pin_ttl_s > 0:
            pin_blocks = (opts.pin_tokens or len(d.prompt_ids)) // block_size
            until = now + opts.pin_ttl_s
        d.session = SessionInfo(opts.session_key if opts is not None else None, chain,
                                pin_blocks, until)
        return PlacementItem(len(d.prompt_ids) + d.sampling.max_tokens, sampled_prefix(chain),
                             d, d.session, d.queue_class, len(d.prompt_ids))

    def _release(self, backend: BackendConn, d: Dispatch, tokens: int) -> None:
        n = min(tokens, d.charged_left)
        if n > 0:
            d.charged_left -= n
            self.placement.release(backend.pid, n)

    def _update_accepting(self, backend: BackendConn) -> None:
        """The policy picks only healthy backends below their in-flight cap."""
        self.placement.set_accepting(backend.pid, backend.healthy and not backend.draining and
                                     backend.num_inflight < self.config.max_inflight_per_backend
                                     # a prefill-only backend gets split prefills alone (issue 34)
                                     and (backend.info is None or
                                          backend.info.role != pb.BackendInfo.PREFILL))

    # --- sending --------------------------------------------------------------------------------
    def send_batch(self, backend: BackendConn, items: list[Dispatch]) -> list[Dispatch] | None:
        """Send one Batch; returns the dispatches now in flight on `backend`, or None when the
        message could not be queued (socket full or closed: nothing was sent). A request whose
        fields do not fit its wire type fails alone (400) and the rest are sent."""
        arrays: list[list[int]] = []
        batch = pb.Batch(batch_id=next(self._batch_ids))
        sent: list[Dispatch] = []
        for d in items:
            try:
                req = pb.GenerateRequest(request_id=d.request_id, prompt_frame=len(arrays),
                                         queue_class=d.queue_class, priority=d.priority,
                                         arrival_time=d.arrival_time, sampling=d.sampling,
                                         deadline=d.deadline)
                if d.speculation is not None:
                    req.speculation.CopyFrom(d.speculation)
                if d.kv_source is not None:  # gateway.kv_pull
                    req.kv_source.CopyFrom(d.kv_source)
                opts = getattr(d.sink, "options", None)
                if opts is not None and opts.pin_ttl_s > 0:  # a pin of its prefix (issue 30)
                    req.pin_ttl_s, req.pin_tokens = opts.pin_ttl_s, opts.pin_tokens
            except (ValueError, TypeError, OverflowError) as exc:
                d.sink.on_error(APIError(400, f"The request does not fit the wire: {exc}",
                                         code="invalid_value"))
                continue
            arrays.append(d.prompt_ids)
            if d.prediction_ids:  # the prediction's ids: their own raw frame
                req.prediction_frame = len(arrays)
                arrays.append(d.prediction_ids)
            batch.requests.append(req)
            sent.append(d)
        if not sent:
            for d in items:
                self._release(backend, d, d.charged_left)
            return sent
        if not backend.send(pb.Envelope(batch=batch), arrays):
            for d in items:
                self._release(backend, d, d.charged_left)
            return None
        for d in sent:
            d.batch_id = batch.batch_id
            backend.inflight[d.request_id] = (d, 0)
            self._owner[d.request_id] = backend
        for d in items:  # those refused by the wire check are not in flight
            if d.request_id not in backend.inflight:
                self._release(backend, d, d.charged_left)
        self._update_accepting(backend)
        return sent

    def abort(self, request_ids: Iterable[str]) -> None:
        """Cancel requests on their backends; their later outputs are ignored."""
        by_backend: dict[int, list[str]] = {}
        for rid in request_ids:
            backend = self._owner.pop(rid, None)
            if backend is None:
                continue
            self._forget(backend, rid)
            by_backend.setdefault(id(backend), []).append(rid)
        for backend in self.backends:
            ids = by_backend.get(id(backend))
            if ids:
                self._send_abort(backend, ids)

    @property
    def num_unsent_aborts(self) -> int:
        """Requests whose Abort waits for room in their backend's socket."""
        return self._aborts.num_waiting

    @property
    def num_abort_retries(self) -> int:
        return self._aborts.num_retries

    def _send_abort(self, backend: BackendConn, ids: list[str]) -> None:
        self._aborts.send(backend, ids)

    def _forget(self, backend: BackendConn, rid: str) -> Dispatch | None:
        entry = backend.inflight.pop(rid, None)
        if entry is None:
            return None
        dispatch, _ = entry
        self._release(backend, dispatch, dispatch.charged_left)
        self._update_accepting(backend)
        if backend.draining and not backend.inflight:
            self._leave_soon(backend)  # its last request is done
        return dispatch

    def _fail_all(self, backend: BackendConn, error: APIError) -> None:
        for rid in list(backend.inflight):
            self._owner.pop(rid, None)
            dispatch = self._forget(backend, rid)
            if dispatch is not None:
                dispatch.sink.on_error(error)

    def _hello(self, backend: BackendConn, now: float) -> None:
        backend.last_hello = now
        backend.send(codec.make_hello(self.config.name, pb.Hello.GATEWAY))

