"""The gateway's backends: one ZMQ DEALER per backend, their health, and the token fan-out.

    BackendPool ── BackendConn(addr) ── DEALER ──► backend ROUTER
                     │ reader task: BackendInfo / LoadReport / StepOutput / Error / Health
                     └ inflight: request_id -> RequestSink (the request's asyncio side)

A backend is *healthy* from its `BackendInfo` until no message arrived from it for
`heartbeat_timeout_s` (backends send a `LoadReport` at least every second). A backend marked
down has its in-flight requests failed at once (never a hang) and gets a fresh `Hello` every
`hello_interval_s`, so a restarted backend rejoins. Malformed messages are dropped and counted.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.abort_outbox import AbortOutbox
from gateway.errors import APIError, backend_error, deadline_exceeded, unavailable
from gateway.zmqio import SocketReader
from proto import codec
from proto import tidegate_pb2 as pb
from proto.convert import FINISH_REASON_FROM_WIRE
from proto.security import CurveKeys
from scheduler.placement import PlacementConfig, PlacementItem, create_placement, prefix_hashes

log = logging.getLogger("tidegate.gateway.pool")

# (sampled token's logprob, top candidate ids, their logprobs)
TokenLogprob = tuple[float, list[int], list[float]]



class RequestSink(Protocol):
    """Where a request's outputs go (implemented by `gateway.core.RequestHandle`)."""

    def on_tokens(self, token_ids: list[int], finish_reason: str | None,
                  logprobs: list[TokenLogprob] | None, now: float) -> None: ...

    def on_error(self, error: APIError) -> None: ...


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


@dataclass(slots=True)
class Dispatch:
    """One request on its way to a backend."""

    request_id: str
    prompt_ids: list[int]
    sampling: pb.SamplingParams
    queue_class: int
    priority: int
    arrival_time: float
    sink: RequestSink
    retried: bool = False  # re-dispatched once already after its backend died
    batch_id: int = 0  # the Batch that carried it to its backend (an Error may name it)
    # tokens of this request still charged to its backend's load (scheduler.placement), all
    # released when it ends
    charged_left: int = 0


def error_from_backend(err: pb.Error) -> APIError:
    if err.code == pb.Error.INVALID_REQUEST:
        return APIError(400, f"Backend refused the request: {err.message}", code="invalid_request")
    if err.code == pb.Error.DEADLINE:
        return deadline_exceeded(f"Backend: {err.message}")
    if err.code in (pb.Error.CAPACITY, pb.Error.SHUTTING_DOWN):
        return unavailable(f"Backend unavailable: {err.message}")
    return backend_error(f"Backend error: {err.message}")


class BackendConn:
    """One backend: its socket, what it told us, and the requests it holds for us."""

    def __init__(self, address: str, ctx: zmq.asyncio.Context,
                 curve: CurveKeys | None = None) -> None:
        self.address = address
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # BackendInfo carries the tokenizer (MBs); anything past the codec's frame limit is
        # refused by libzmq before it is buffered.
        self.sock.setsockopt(zmq.MAXMSGSIZE, codec.MAX_FRAME_BYTES)
        if curve is not None and address.startswith("tcp://"):
            curve.apply_client(self.sock)
        self.sock.connect(address)
        self.io = SocketReader(self.sock, self._no_handler)  # the pool sets the handler
        self.info: pb.BackendInfo | None = None
        self.load = pb.LoadReport()
        self.healthy = False
        self.last_seen = 0.0
        self.last_hello = 0.0
        self.inflight: dict[str, tuple[Dispatch, int]] = {}  # id -> (dispatch, tokens so far)
        self.pid = -1                   # this backend's id in the placement policy
        self.placement = None           # the pool's policy (reads this backend's load)
        self.draining = False           # takes no new requests; leaves when its last one ends

    @property
    def num_inflight(self) -> int:
        return len(self.inflight)

    @property
    def outstanding_tokens(self) -> int:
        """Tokens still to process for us here: prompts not yet prefilled (less what the policy
        expects cached) and outputs not yet generated."""
        return self.placement.load(self.pid) if self.placement is not None else 0

    @property
    def kv_cache_usage(self) -> float:
        total = self.load.num_total_blocks
        return 1.0 - self.load.num_free_blocks / total if total else 0.0

    @staticmethod
    def _no_handler(frames) -> None:
        pass

    def send(self, envelope: pb.Envelope, arrays: Iterable = ()) -> bool:
        """Queue one message without waiting; False if the socket would block or is closed."""
        return self.io.send(codec.encode_trusted(envelope, arrays))


class BackendPool:
    def __init__(self, addresses: list[str], config: PoolConfig = PoolConfig(),
                 on_idle: Callable[[], None] | None = None,
                 on_dropped: Callable[[str], None] | None = None,
                 on_retry: Callable[[int], None] | None = None) -> None:
        if not addresses:
            raise ValueError("a BackendPool needs at least one backend address")
        self.config = config
        self._ctx = zmq.asyncio.Context()
        self.backends = []
        self.placement = create_placement(config.placement)
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
        placed = [PlacementItem(len(d.prompt_ids) + d.sampling.max_tokens,
                                prefix_hashes(d.prompt_ids, block_size) if hashing else (), d)
                  for d in items]
        policy.place(placed, now)
        parts: dict[int, list[Dispatch]] = {}
        unplaced: list[Dispatch] = []
        for it in placed:
            d = it.payload
            if it.backend < 0:
                unplaced.append(d)
                continue
            d.charged_left = it.charged
            parts.setdefault(it.backend, []).append(d)
        return [(self._by_pid[b], ds) for b, ds in parts.items()], unplaced

    def _release(self, backend: BackendConn, d: Dispatch, tokens: int) -> None:
        n = min(tokens, d.charged_left)
        if n > 0:
            d.charged_left -= n
            self.placement.release(backend.pid, n)

    def _update_accepting(self, backend: BackendConn) -> None:
        """The policy picks only healthy backends below their in-flight cap."""
        self.placement.set_accepting(backend.pid, backend.healthy and not backend.draining and
                                     backend.num_inflight < self.config.max_inflight_per_backend)

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
                                         arrival_time=d.arrival_time, sampling=d.sampling)
            except (ValueError, TypeError, OverflowError) as exc:
                d.sink.on_error(APIError(400, f"The request does not fit the wire: {exc}",
                                         code="invalid_value"))
                continue
            batch.requests.append(req)
            arrays.append(d.prompt_ids)
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

    # --- receiving ------------------------------------------------------------------------------
    def _reader_for(self, backend: BackendConn) -> Callable[[list], None]:
        """The message handler of `backend`'s socket reader (called from the event loop)."""
        decode, handle = codec.decode, self._handle

        def on_message(frames: list) -> None:
            try:
                handle(backend, decode(frames))
            except codec.DecodeError as exc:
                self.num_dropped += 1
                self._on_dropped("backend")
                log.warning("dropped a malformed message from %s: %s", backend.address, exc)
                # Its outputs (a finish among them, maybe) are lost: the requests it names fail
                # now instead of waiting for their timeout.
                for rid in codec.peek_request_ids(frames):
                    if rid in backend.inflight:
                        self._fail_one(backend, rid, backend_error(
                            f"The backend sent a malformed message for this request: {exc}",
                            code="bad_backend_output"))
            except Exception:  # a bug here must not stop the reader
                self.num_dropped += 1
                log.exception("error handling a message from %s", backend.address)
        return on_message

    def _handle(self, backend: BackendConn, decoded: codec.Decoded) -> None:
        now = time.monotonic()
        env, kind = decoded.envelope, decoded.kind
        if kind == "backend_info":
            codec.check_version(env.backend_info.protocol_version)
            if not backend.healthy:
                log.info("backend %s up: model %s", backend.address, env.backend_info.model)
            backend.info = env.backend_info
            self._info = None  # recomputed on the next read
            self._mark_up(backend, now)
            self._ready.set()
        elif backend.info is None:
            if kind != "error":
                return  # not introduced yet (e.g. reports from before our Hello)
        elif backend.healthy:
            backend.last_seen = now
        else:
            # Marked down: only a BackendInfo (its answer to our Hello) brings it back. Messages
            # still buffered from a process that died, or from a hung one, would otherwise mark
            # a dead backend up with a stale load (its requests were already failed or moved).
            return
        if kind == "step_output":
            self._on_step(backend, decoded, now)
        elif kind == "load_report":
            report = backend.load = env.load_report
            if report.prefix_block_size:  # the backend keeps a prefix cache: facts
                self.placement.report(backend.pid, report.prefix_hashes, now)
            # an HTTP server's blocks are a usage scale, not blocks: it gives its size apart
            self.placement.set_capacity(backend.pid, getattr(
                backend, "kv_capacity_tokens", report.num_total_blocks * backend.info.block_size))
            if report.num_running == 0 and report.num_waiting == 0:
                self._on_idle()
        elif kind == "error":
            self._on_error(backend, env.error)
        elif kind == "health" and not env.health.reply:
            backend.send(codec.make_health(env.health.nonce, time.time(), reply=True))

    def _mark_up(self, backend: BackendConn, now: float) -> None:
        backend.last_seen = now
        if not backend.healthy:
            backend.healthy = True
            self._update_accepting(backend)
            self._on_idle()

    def _on_step(self, backend: BackendConn, decoded: codec.Decoded, now: float) -> None:
        if not backend.inflight:
            return  # nothing of ours there (late outputs of aborted requests): ignore
        self._fan_out(backend, decoded, now)
        if not backend.inflight:
            self._on_idle()  # its last request of ours finished: idle flush, no LoadReport wait

    def _fan_out(self, backend: BackendConn, decoded: codec.Decoded, now: float) -> None:
        """Hand each RequestOutput to its request. One output that cannot be read fails its own
        request; the others of the StepOutput are delivered."""
        for out in decoded.envelope.step_output.outputs:
            entry = backend.inflight.get(out.request_id)
            if entry is None:
                continue  # aborted or unknown: ignore
            try:
                self._deliver(backend, decoded, out, entry, now)
            except Exception as exc:
                log.exception("output for %s from %s unreadable", out.request_id, backend.address)
                self._fail_one(backend, out.request_id,
                               backend_error(f"The backend sent an unreadable output: {exc}",
                                             code="bad_backend_output"))

    def _deliver(self, backend: BackendConn, decoded: codec.Decoded, out: pb.RequestOutput,
                 entry: tuple[Dispatch, int], now: float) -> None:
        dispatch, generated = entry
        rid = out.request_id
        if out.finish_reason == pb.RequestOutput.ERROR:
            self._fail_one(backend, rid, backend_error("The backend failed the request."),
                           abort=False)
            return
        arr = codec.array_of(decoded, out.tokens_frame)
        ids = arr.tolist() if arr is not None else []
        if out.num_completion_tokens != generated + len(ids):
            # Outputs of one request travel in order on one connection; a count that does not
            # add up means a StepOutput was lost (dropped by a full queue, or garbled): the
            # text would silently miss tokens, so the request fails instead.
            self.num_gaps += 1
            self._fail_one(backend, rid, backend_error(
                f"Lost output from backend {backend.address}: expected token "
                f"{generated + len(ids)}, the backend reports {out.num_completion_tokens}.",
                code="output_gap"))
            return
        backend.inflight[rid] = (dispatch, generated + len(ids))
        # The charge is released at the finish (`_forget`), as in the simulator: a running
        # request holds a batch slot and its KV until then, so counting it whole is a stand-in
        # for what slows the backend's steps. Releasing one per token here (until the third
        # session) made least-loaded picks differ from the simulator's; releasing the prompt's
        # share at the first token made a hot prefix's holder look idle while it decoded a
        # batch 4x the others' (simulated 6.7B on H200: TPOT 13.6 vs 5.9 ms at 80 req/s).
        finish = FINISH_REASON_FROM_WIRE.get(out.finish_reason)
        if finish is not None:
            self._owner.pop(rid, None)
            self._forget(backend, rid)
        lps = [(lp.logprob, list(lp.top_ids), list(lp.top_logprobs)) for lp in out.logprobs] \
            if out.logprobs else None
        dispatch.sink.on_tokens(ids, finish, lps, now)

    def _fail_one(self, backend: BackendConn, rid: str, error: APIError,
                  abort: bool = True) -> None:
        """Fail one in-flight request (and, unless the backend ended it, abort it there)."""
        self._owner.pop(rid, None)
        dispatch = self._forget(backend, rid)
        if abort:
            self._send_abort(backend, [rid])
        if dispatch is not None:
            dispatch.sink.on_error(error)

    def _on_error(self, backend: BackendConn, err: pb.Error) -> None:
        if err.request_id:
            self._owner.pop(err.request_id, None)
            dispatch = self._forget(backend, err.request_id)
            if dispatch is not None:
                dispatch.sink.on_error(error_from_backend(err))
            return
        log.warning("backend %s reports: %s (%s)", backend.address, err.message,
                    pb.Error.Code.Name(err.code))
        if err.code == pb.Error.VERSION_MISMATCH:
            self._mark_down(backend, f"protocol version mismatch: {err.message}")
        elif err.code in (pb.Error.BAD_MESSAGE, pb.Error.INTERNAL):
            # An Error naming no request answers a message the backend could not read or
            # handle. Batches are the only messages that start work. Its requests that have
            # no output yet fail (and are aborted, in case some were admitted) rather than
            # wait for their timeout; those producing tokens were admitted and carry on.
            if err.batch_id:  # the backend names the Batch: exactly its requests
                named = [rid for rid, (d, n) in backend.inflight.items()
                         if n == 0 and d.batch_id == err.batch_id]
            elif backend.info is not None and codec.echoes_batch_ids(
                    backend.info.protocol_version):
                # A 1.1 backend names the Batch whenever the message was one (the id leads
                # the message): this one was not, and no request of ours is concerned.
                named = []
            else:  # a 1.0 backend cannot say which Batch: every one not yet confirmed
                named = [rid for rid, (_, n) in backend.inflight.items() if n == 0]
            for rid in named:
                self._fail_one(backend, rid, error_from_backend(err))

    # --- heartbeats -----------------------------------------------------------------------------
    async def _watch_connection(self, backend: BackendConn) -> None:
        """ZMQ socket events: a dropped connection (the backend process died) marks the backend
        down at once, without waiting for the heartbeat window; a new one gets a Hello."""
        mon = backend.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            while True:
                event = parse_monitor_message(await mon.recv_multipart())["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    self._mark_down(backend, "connection lost")
                elif event == zmq.EVENT_CONNECTED and not backend.healthy:
                    self._hello(backend, time.monotonic())
        finally:
            backend.sock.disable_monitor()
            mon.close(linger=0)

    async def _monitor(self) -> None:
        period = min(self.config.heartbeat_timeout_s / 4, self.config.hello_interval_s)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for b in self.backends:
                if b.healthy and now - b.last_seen > self.config.heartbeat_timeout_s:
                    waiting = b.sock is not None and b.sock.get(zmq.EVENTS) & zmq.POLLIN
                    b.io.check()  # reading EVENTS may have eaten the readable edge
                    if waiting:
                        continue  # messages are waiting: we are slow, not the backend
                    self._mark_down(b, f"no message for {now - b.last_seen:.1f} s")
                if not b.healthy and now - b.last_hello >= self.config.hello_interval_s:
                    self._hello(b, now)
                elif b.healthy and now - b.last_seen > self.config.heartbeat_timeout_s / 2:
                    b.send(codec.make_health(next(self._nonce), time.time()))

    def _mark_down(self, backend: BackendConn, reason: str) -> None:
        if backend.healthy:
            log.warning("backend %s down: %s", backend.address, reason)
        backend.healthy = False
        self._update_accepting(backend)
        self._evacuate(backend, reason)

    def _evacuate(self, backend: BackendConn, reason: str) -> None:
        """A backend went down with requests of ours. They are aborted there (a hung process
        that comes back frees their KV blocks; a dead one ignores it); one that has produced no
        token yet is sent once more to another healthy backend, one that streamed tokens fails:
        its text cannot be resumed elsewhere without repeating or skipping output."""
        ids = list(backend.inflight)
        if not ids:
            return
        self._send_abort(backend, ids)
        retry: list[Dispatch] = []
        for rid in ids:
            generated = backend.inflight[rid][1]
            self._owner.pop(rid, None)
            dispatch = self._forget(backend, rid)
            if dispatch is None:
                continue
            if generated == 0 and not dispatch.retried:
                retry.append(dispatch)
            else:
                dispatch.sink.on_error(backend_error(
                    f"Backend {backend.address} stopped answering ({reason}) after {generated} "
                    "tokens of this request were produced; it cannot be resumed.",
                    code="backend_down"))
        if retry:
            self._retry(retry, backend, reason)

    def _retry(self, items: list[Dispatch], failed: BackendConn, reason: str) -> None:
        cap = self.config.max_inflight_per_backend
        target = min((b for b in self.backends if b.healthy and b is not failed
                      and not b.draining and b.num_inflight + len(items) <= cap),
                     key=lambda b: (b.outstanding_tokens, b.num_inflight), default=None)
        sent = None
        if target is not None:
            for d in items:
                d.retried = True
                d.charged_left = len(d.prompt_ids) + d.sampling.max_tokens  # uncached there
                self.placement.charge(target.pid, d.charged_left)
            sent = self.send_batch(target, items)
        if sent is None:
            for d in items:
                d.sink.on_error(backend_error(
                    f"Backend {failed.address} stopped answering ({reason}) and no other "
                    "backend could take the request.", code="backend_down"))
            return
        self.num_retried += len(sent)
        self._on_retry(len(sent))
        log.info("re-dispatched %d requests from %s to %s", len(sent), failed.address,
                 target.address)
