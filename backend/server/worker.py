"""The backend worker: one ZMQ ROUTER socket in front of one engine (`backend.engine.interface.ServingEngine`: ours, echo or vLLM).

Loop (single thread): drain every queued message (Hello, Batch, Abort, Health) -> one engine
step if there is work -> one `StepOutput` per gateway holding all its requests' new tokens ->
a `LoadReport` when due (<= 100 ms apart while busy, 1 s while idle). Messages that arrive while
a step runs wait in the socket and are handled before the next step. On a device that runs
asynchronously (CUDA) each turn is `Engine.advance()`: the next step is launched (with async
scheduling, before the previous one is read back) and the previous step's tokens come back, so
that sending them, draining the socket and planning the step after run while the device works
on the launched one; the host's work is off the steps' critical path.

Beside the loop, one thread (`backend.server.kv_serve`, issue 34) answers peers' prefix pulls on
a KV socket of its own while the loop steps; the loop holds `kv_lock` whenever it touches the
block manager (everything but its polls and the forward pass / read-back wait).

Replies (the gateway side of the contract):
- `Hello` -> `BackendInfo` (tokenizer JSON and chat template included); another MAJOR
  protocol version -> `Error{VERSION_MISMATCH}`.
- `Batch` request refused (invalid, can never fit) -> `Error{INVALID_REQUEST, request_id}`;
  after SIGTERM -> `Error{SHUTTING_DOWN, request_id}`.
- `Abort` -> the request's final `RequestOutput{finish_reason: ABORT}` in the next StepOutput
  (sent at once when idle); unknown ids are ignored.
- anything malformed or unexpected -> `Error{BAD_MESSAGE}`; the worker carries on. An Error about a
  Batch names its requests (`request_id`) when they can be read, and the Batch (`batch_id`, read
  from the head of the message even when the rest does not parse) always.
- a step that raises (device OOM, a bug): every in-flight request gets `Error{INTERNAL, request_id}`,
  the worker carries on.
- SIGTERM / SIGINT: finish the running step, send its outputs, answer every in-flight request
  with `Error{SHUTTING_DOWN, request_id}`, exit 0.

Request ids are per gateway: internally a request is keyed by (gateway identity, request id).
"""
from __future__ import annotations

import errno
import importlib.metadata
import signal
import sys
import threading
import time
import uuid
from collections import defaultdict, deque

import zmq

from backend.engine.continuous import RequestOutput
from backend.engine.interface import ServingEngine
from backend.kv.transfer import ZmqKVTransport
from backend.model.loader import LoadedModel
from backend.server.kv_pull import DEFAULT_LAND_WAIT_S, PrefixPuller
from backend.server.kv_serve import KVServer, kv_listen_for
from backend.server.step_log import StepLog
from proto import codec
from proto import tidegate_pb2 as pb
from proto.convert import FINISH_REASON_TO_WIRE
from proto.sampling import check_sampling, from_wire
from proto.security import CurveKeys, start_authenticator
from scheduler.prefix_index import PrefixSummary
from tokenizer.grammar import GrammarSpec

try:
    ENGINE_VERSION = importlib.metadata.version("tidegate")
except importlib.metadata.PackageNotFoundError:  # run from a source tree
    ENGINE_VERSION = "0+unknown"
BUSY_REPORT_S = 0.1
IDLE_REPORT_S = 1.0
MAX_MESSAGES_PER_DRAIN = 1024
# Messages held for one gateway whose socket queue is full (ROUTER_MANDATORY says so instead of
# dropping them). Past this the gateway is not reading: its requests are aborted (KV freed) and
# it is forgotten; it will mark this backend down by heartbeat and fail them on its side.
MAX_OUTBOX_MESSAGES = 4096
MAX_LOGPROBS = 64  # top-n logprobs per token a backend computes at most
# the most of its KV blocks a backend lets prefix pins hold (issue 30); over it a request is
# served unpinned and told so
PIN_BUDGET_FRACTION = 0.25



def _key(identity: bytes, request_id: str) -> str:
    return f"{identity.hex()}/{request_id}"


class Worker:
    def __init__(self, engine: ServingEngine, loaded: LoadedModel, listen: str,
                 backend_id: str | None = None, model_name: str | None = None,
                 security: CurveKeys | None = None,
                 step_log: StepLog | None = None,
                 max_held_messages: int = MAX_OUTBOX_MESSAGES,
                 generation_defaults: dict[str, float] | None = None,
                 pin_budget_fraction: float = PIN_BUDGET_FRACTION,
                 kv_events=None, kv_pull_timeout_s: float | None = None,
                 role: int = pb.BackendInfo.MIXED, kv_pull_checksum: bool = True,
                 kv_serve: str = "thread", kv_listen: str | None = None,
                 kv_pull_land_wait_s: float = DEFAULT_LAND_WAIT_S, kv_pull_ipc: bool = False) -> None:
        self.engine = engine
        self.role = role  # BackendInfo.Role: a prefill-only backend gets only split prefills
        # the model's sampling defaults (backend.model.generation_config), sent in BackendInfo
        self.generation_defaults = dict(generation_defaults or {})
        self.max_held_messages = max_held_messages
        self.step_log = step_log
        self.loaded = loaded
        self.backend_id = backend_id or f"backend-{uuid.uuid4().hex[:8]}"
        self.model_name = model_name or loaded.config.name
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 2000)
        # A full or vanished peer is an error we handle (see _send), never a silent drop.
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.MAXMSGSIZE, codec.MAX_FRAME_BYTES)
        self._auth = None
        if security is not None and listen.startswith("tcp://"):
            self._auth = start_authenticator(self.ctx, security.allow_dir)
            security.apply_server(self.sock)
        self.sock.bind(listen)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.gateways: set[bytes] = set()
        self.outbox: dict[bytes, deque[list]] = {}  # identity -> frames waiting for room
        self.num_backpressured = 0  # messages that had to wait in an outbox
        self.num_gateways_dropped = 0  # gateways forgotten (gone, or not reading)
        self.owner: dict[str, tuple[bytes, str]] = {}  # engine key -> (identity, request id)
        self.pending: dict[bytes, list[RequestOutput]] = defaultdict(list)
        self.num_steps = 0
        self.step_time_ema_ms = 0.0
        # per gateway: its clock read on ours (`_local_deadline`)
        self._clock_offset: dict[bytes, float] = {}
        self._last_read_back = 0.0  # perf_counter of the last step read back
        self._last_report = 0.0
        self._was_busy = False
        self._idle_checked = True
        self._stopping = False
        # What our prefix cache holds, for the gateway's placement (LoadReport.prefix_hashes);
        # only an engine with a real block manager and its prefix cache on can answer.
        self._is_cached = engine.prefix_cache_probe()
        self.prefix_summary = (PrefixSummary(engine.config.block_size)
                               if self._is_cached is not None else None)
        # prefix pins (issue 30): an engine with a block manager and its prefix cache pins
        # within a budget of its blocks; (gateway, request id) -> the status its first output says
        engine.configure_pins(pin_budget_fraction)
        self.pin_status: dict[tuple[bytes, str], int] = {}
        # KV events in vLLM's format (backend.server.kv_events.KVEventPublisher, issue 33): the
        # block manager records its prefix-cache changes, each turn's go out as one batch
        self.kv_events = kv_events
        self._kv_recording = False
        if kv_events is not None:
            if not engine.record_kv_events():
                raise ValueError("KV events need an engine with a block manager and its prefix "
                                 "cache on (not echo, not --no-prefix-caching)")
            self._kv_recording = True
        # prefix pull (issue 34, backend.server.kv_pull): requests with a kv_source wait there
        # for their blocks from a peer; peers' pulls are answered from our pools
        port = engine.kv_port(self.model_name)
        self.puller = PrefixPuller(port, None if port is None else ZmqKVTransport(
            self.ctx, security), checksum=kv_pull_checksum,
            land_wait_s=kv_pull_land_wait_s if kv_serve == "thread" else 0.0, ipc=kv_pull_ipc,
            **({} if kv_pull_timeout_s is None else {"timeout_s": kv_pull_timeout_s}))
        # peers' pulls answered off the step loop (backend.server.kv_serve): a thread on its own
        # socket reads blocks while this loop steps; the loop holds `kv_lock` whenever it
        # touches the block manager (all but its polls and the forward pass)
        if kv_serve not in ("thread", "loop"):
            raise ValueError(f"kv_serve is 'thread' or 'loop', not {kv_serve!r}")
        self.kv_lock = None
        self.kv_server: KVServer | None = None
        if port is not None and kv_serve == "thread" and hasattr(engine, "step_unlocked"):
            self.kv_lock = threading.Lock()  # (the engine releases it only in serve_forever)
            self.kv_server = KVServer(port, self.kv_lock, kv_listen or kv_listen_for(listen),
                                      self.ctx, security, kv_pull_checksum)

    # ---- lifecycle -----------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self._stopping = True

    @staticmethod
    def ignore_signals() -> None:
        """After the shutdown: our handlers -> SIG_IGN, one `sigaction` each. Interpreter
        finalization resets Python-level handlers to SIG_DFL, so a supervisor's late second
        SIGTERM would turn the drained exit 0 into a kill (-15: 10 of 10 backends under a SIGTERM
        storm, session 18); SIG_IGN it leaves alone (gateway.stop_signals explains the same for
        the gateway)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)

    def serve_forever(self) -> int:
        lock = self.kv_lock
        if lock is None:
            return self._serve_forever()
        lock.acquire()  # released while polling and in the forward pass (kv_serve)
        self.engine.step_unlocked = lock
        try:
            return self._serve_forever()
        finally:
            self.engine.step_unlocked = None
            lock.release()

    def _poll(self, poller: zmq.Poller, wait_ms: int) -> list:
        lock = self.kv_lock
        if lock is None or wait_ms <= 0:
            return poller.poll(wait_ms)
        lock.release()
        try:
            return poller.poll(wait_ms)
        finally:
            lock.acquire()

    def _serve_forever(self) -> int:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        launch_deadline = self.engine.launch_deadline
        while not self._stopping:
            busy = self.engine.has_unfinished()
            deadline = launch_deadline() if busy else None
            if busy:
                # async scheduling: take messages until the next step must be launched, so that
                # requests arriving now join it (Engine.launch_deadline)
                wait_ms = 0 if deadline is None else \
                    max(0, int((deadline - time.perf_counter()) * 1000))
            else:
                wait_ms = max(0, int((self._last_report + IDLE_REPORT_S - time.monotonic()) * 1000))
                if self.outbox:
                    wait_ms = min(wait_ms, 5)  # retry held messages soon
            puller = self.puller
            if puller.active:
                puller.sync_poller(poller)
                wait_ms = puller.wait_ms(wait_ms)
            try:
                ready = self._poll(poller, wait_ms)
            except zmq.ZMQError:  # interrupted by a signal
                continue
            if ready:
                self._drain()
            if puller.active:
                self._admit_pulled()
                if puller.num_parked and self.engine.has_unfinished():
                    self._await_landing(poller)
            if self.engine.has_unfinished() and not self._stopping:
                if deadline is None or time.perf_counter() >= deadline:
                    self._step()
                    self._release_pull_holds()  # the step allocated the requests it started
            elif not self._idle_checked:
                self._check_idle()
            if self._kv_recording:
                # before the step's outputs go out: a router that reads both sees the blocks
                # of a finished request first
                events = self.engine.take_kv_events()
                if events:
                    self.kv_events.publish(events)
            self._flush_outboxes()
            self._flush_pending()  # CUDA: while the step launched by _step runs
            self._maybe_report()
        self._shutdown()
        return 0

    def _await_landing(self, poller: zmq.Poller) -> None:
        """Hold the next step (at most the puller's land wait) for pulls about to land, so that
        their requests join it instead of the one after (a whole step later, on a busy loop)."""
        puller = self.puller
        end = time.monotonic() + puller.land_wait_s
        while puller.num_parked and not self._stopping:
            ms = min(puller.land_wait_ms(), int((end - time.monotonic()) * 1000))
            if ms <= 0:
                return
            puller.sync_poller(poller)
            try:
                ready = self._poll(poller, ms)
            except zmq.ZMQError:
                return
            if not ready:
                return
            self._drain()
            self._admit_pulled()

    def _admit_pulled(self) -> None:
        """Admit the requests whose prefix pull ended (blocks in, or recompute): once each;
        answer peers' pulls that waited for a prefill here."""
        for p in self.puller.take_ready():
            self._add(p.identity, p.req, p.prompt, p.prediction)
            self.puller.keep_hold(p)
        self._release_pull_holds()
        for identity, frames in self.puller.take_answers():
            self._send_raw(identity, frames)

    def _release_pull_holds(self) -> None:
        """Landed prefixes are held until their request is allocated (its sequence then holds
        them) or gone (finished, refused, aborted): `PrefixPuller.keep_hold`."""
        puller = self.puller
        if puller.num_holds:
            bm = puller.port.bm
            puller.release_holds(lambda key: key not in self.owner or bm.has_seq(key))

    def _send_raw(self, identity: bytes, frames: list) -> None:
        """Frames already encoded (KV blocks), in order behind what waits for that peer."""
        frames = [identity, *frames]
        box = self.outbox.get(identity)
        if box is not None:
            self._hold(identity, box, frames)
        else:
            self._send_now(identity, frames)

    def _shutdown(self) -> None:
        try:  # the step in flight (async loop) finishes and its tokens go out first
            self._deliver(self.engine.settle())
        except Exception as exc:  # noqa: BLE001 -- still answer every request below
            print(f"tidegate backend: last step failed: {exc!r}", file=sys.stderr)
        self._flush_pending()
        self._fail_all("backend is shutting down", pb.Error.SHUTTING_DOWN)
        self._flush_outboxes()
        promoted = self.engine.load().num_promoted  # the deadline order's (EngineLoad)
        if promoted:
            print(f"tidegate backend: deadline order: {promoted} admissions moved before the "
                  "class order's next request", file=sys.stderr)
        self._close_kv_server()
        self.sock.close()
        if self.step_log is not None:
            self.step_log.write()
        self._stop_auth()
        self._close_kv_events()

    def _close_kv_events(self) -> None:
        if self.kv_events is not None:
            if self._kv_recording:
                self.kv_events.publish(self.engine.take_kv_events())
            self.kv_events.close()
            self.kv_events = None

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def _fail_all(self, message: str, code: int = pb.Error.INTERNAL) -> None:
        """Answer every in-flight request with an Error and drop it from the engine."""
        if self.owner:
            print(f"tidegate backend: failing {len(self.owner)} requests: {message}", file=sys.stderr)
        for key in self.engine.request_ids:
            self.engine.abort(key)
        owners = list(self.owner.values())
        owners += [(p.identity, p.req.request_id) for p in self.puller.cancel_all()]
        self.owner.clear()
        for identity, rid in owners:
            self._send(identity, codec.make_error(code, message, rid))

    def _close_kv_server(self) -> None:
        if self.kv_server is not None:
            self.kv_server.close()

    def close(self) -> None:
        self._close_kv_server()
        self.puller.close()
        self.sock.close(linger=0)
        self._stop_auth()
        self._close_kv_events()

    # ---- receiving -----------------------------------------------------------------------
    def _drain(self) -> None:
        for _ in range(MAX_MESSAGES_PER_DRAIN):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = frames[0].bytes
            try:
                self._handle(identity, frames[1:])
            except codec.DecodeError as exc:
                # Whatever request ids can still be read are answered one by one, so the
                # gateway fails exactly those requests (not a whole connection's worth).
                ids = codec.peek_request_ids(frames[1:])
                batch_id = codec.peek_batch_id(frames[1:])
                for rid in ids:
                    self._send(identity, codec.make_error(pb.Error.BAD_MESSAGE, str(exc), rid,
                                                          batch_id))
                if not ids:
                    self._send(identity, codec.error_for(exc, batch_id))
            except Exception as exc:  # noqa: BLE001 -- a bug must not take the backend down
                print(f"tidegate backend: internal error handling a message: {exc!r}", file=sys.stderr)
                self._send(identity, codec.make_error(pb.Error.INTERNAL, f"internal error: {exc}",
                                                      batch_id=codec.peek_batch_id(frames[1:])))

    def _handle(self, identity: bytes, frames) -> None:
        msg = codec.decode(frames)
        kind = msg.kind
        if kind == "hello":
            codec.check_version(msg.envelope.hello.protocol_version)
            self.gateways.add(identity)
            self._send(identity, pb.Envelope(backend_info=self.backend_info()))
        elif kind == "batch":
            self.gateways.add(identity)
            for req in msg.envelope.batch.requests:
                try:
                    prediction = codec.array_of(msg, req.prediction_frame) \
                        if req.HasField("prediction_frame") else None
                    prompt = codec.array_of(msg, req.prompt_frame)
                    key = _key(identity, req.request_id)
                    if self.puller.is_parked(key):
                        self._send(identity, codec.make_error(
                            pb.Error.INVALID_REQUEST, f"duplicate request id {req.request_id!r}",
                            req.request_id))
                        continue
                    if req.HasField("kv_source") and not self._stopping and \
                            self.puller.park(identity, key, req, prompt, prediction):
                        continue  # admitted when its pull ends (_admit_pulled)
                    self._add(identity, req, prompt, prediction)
                except Exception as exc:  # noqa: BLE001 -- fail this request, admit the rest
                    print(f"tidegate backend: request {req.request_id!r} failed on admission: "
                          f"{exc!r}", file=sys.stderr)
                    key = _key(identity, req.request_id)
                    if key not in self.owner:
                        self.engine.abort(key)
                        self._send(identity, codec.make_error(
                            pb.Error.INTERNAL, f"admission failed: {exc}", req.request_id))
        elif kind == "abort":
            for rid in msg.envelope.abort.request_ids:
                key = _key(identity, rid)
                if self.puller.cancel(key) is not None:  # waiting for its pull: never admitted
                    self.pending[identity].append(RequestOutput(rid, [], [], "abort"))
                    continue
                record = self.engine.abort(key)
                if record is not None:
                    self.owner.pop(key, None)
                    record.request_id = rid
                    self.pending[identity].append(record)
        elif kind == "health":
            h = msg.envelope.health
            if not h.reply:
                self._send(identity, codec.make_health(h.nonce, time.time(), reply=True))
        elif kind == "kv_pull":  # a peer backend pulls prefix blocks (issue 34): raw frames
            answer = self.puller.serve(identity, msg)
            if answer is not None:  # else: it waits for a prefill in flight (_admit_pulled)
                self._send_raw(identity, answer)
        else:
            self._send(identity, codec.make_error(
                pb.Error.BAD_MESSAGE, f"a backend does not accept {kind} messages"))

    def _local_deadline(self, identity: bytes, req: pb.GenerateRequest) -> float:
        """The request's deadline on this process's time.monotonic(). A gateway stamps
        arrival_time and deadline on its own clock; the least (our receipt - its arrival_time)
        seen from it so far is that clock's offset from ours plus its fastest path to the engine
        (~1 ms on one host, where the two clocks are one), so the deadline is read late by at
        most that path, wherever the gateway runs."""
        offset = time.monotonic() - req.arrival_time
        known = self._clock_offset.get(identity)
        if known is None or offset < known:
            self._clock_offset[identity] = known = offset
        return req.deadline + known

    def _add(self, identity: bytes, req: pb.GenerateRequest, prompt, prediction=None) -> None:
        rid = req.request_id
        if self._stopping:
            self._send(identity, codec.make_error(pb.Error.SHUTTING_DOWN, "backend is shutting down", rid))
            return
        if prompt is None or len(prompt) == 0:
            self._send(identity, codec.make_error(pb.Error.INVALID_REQUEST, "request has no prompt tokens", rid))
            return
        # the one conversion and the one check (proto.sampling), as the gateway ran them: a
        # value outside its range or the model's vocabulary fails its request here, not a step
        params = from_wire(req.sampling, GrammarSpec)
        vocab = self.loaded.config.vocab_size
        invalid = check_sampling(params, vocab, min(MAX_LOGPROBS, vocab), backend=True)
        if invalid is not None:
            self._send(identity, codec.make_error(pb.Error.INVALID_REQUEST, invalid.message, rid))
            return
        key = _key(identity, rid)
        # speculative decoding (issue 28): the prediction's ids and the request's own control,
        # for an engine that speculates (ours); another engine serves the request without them
        spec_kw = {}
        if self.engine.speculator is not None:
            if prediction is not None and len(prediction):
                if len(prediction) > self.engine.config.max_model_len:
                    self._send(identity, codec.make_error(
                        pb.Error.INVALID_REQUEST, f"prediction has {len(prediction)} tokens, more "
                        f"than max_model_len ({self.engine.config.max_model_len})", rid))
                    return
                spec_kw["prediction"] = prediction.tolist()
            if req.HasField("speculation"):
                spec_kw["speculation_off"] = bool(req.speculation.off)
                spec_kw["max_draft_tokens"] = int(req.speculation.max_draft_tokens)
        if key in self.owner:
            reason = f"duplicate request id {rid!r}"
        else:
            ids = prompt.tolist()
            if req.deadline > 0:  # its TTFT deadline (tidegate serve --deadline-order)
                spec_kw["deadline"] = self._local_deadline(identity, req)
            reason = self.engine.add_request(key, ids, params, req.arrival_time, req.priority,
                                             **spec_kw)
        if reason is not None:
            self._send(identity, codec.make_error(pb.Error.INVALID_REQUEST, reason, rid))
            return
        self.owner[key] = (identity, rid)
        if req.pin_ttl_s > 0:  # a pin of the prompt's prefix (issue 30)
            pinned = self.engine.request_pin(key, ids, req.pin_tokens or len(ids), req.pin_ttl_s)
            self.pin_status[(identity, rid)] = (
                pb.RequestOutput.PIN_UNSUPPORTED if pinned is None else
                pb.RequestOutput.PINNED if pinned else pb.RequestOutput.PIN_OVER_BUDGET)
        if self.prefix_summary is not None:
            self.prefix_summary.add_prompt(ids)
        self._idle_checked = False

    # ---- stepping and sending --------------------------------------------------------------
    def _step(self) -> None:
        engine = self.engine
        if self.puller.num_parked:
            self.puller.note_step()
        t0 = time.perf_counter()
        try:
            # CUDA: launch the next step, read back the previous one (Engine.advance); else
            # one whole step
            outputs = engine.advance() if engine.overlaps_device else engine.step()
        except Exception as exc:  # noqa: BLE001 -- e.g. device OOM: fail the requests, not the process
            first_line = (str(exc).splitlines() or [""])[0]
            self._fail_all(f"step failed: {type(exc).__name__}: {first_line}")
            return
        self._was_busy = True  # a request that finishes in its first step still makes an edge
        self._deliver(outputs, time.perf_counter() - t0)

    def _deliver(self, outputs: list[RequestOutput], turn_s: float | None = None) -> None:
        """Account for the step just read back (step log, step-time average) and queue its
        records for their gateways. `turn_s`: the turn's time, for engines that do not say
        which step they read back (echo, vLLM: one whole step a turn)."""
        step = self.engine.last_step
        dt_s = None
        if step is not None:
            # the cadence tokens come out at: from the later of its launch and the last
            # read-back to its own read-back (back-to-back steps: their device time)
            dt_s = step.end - max(step.start, self._last_read_back)
            self._last_read_back = step.end
            if self.step_log is not None:
                phases = getattr(step, "host_phases", None)
                self.step_log.record(step.start_wall, dt_s, step.plan, step.device_s,
                                     getattr(step, "device_idle_s", None),
                                     phases() if phases is not None else None)
            self.puller.observe_step(step.plan, step.device_s or (step.end - step.start))
        elif not self.engine.reports_steps:
            dt_s = turn_s
        if dt_s is not None:
            dt_ms = dt_s * 1000
            self.step_time_ema_ms = dt_ms if self.num_steps == 0 else \
                0.8 * self.step_time_ema_ms + 0.2 * dt_ms
            self.num_steps += 1
        for out in outputs:
            identity, rid = self.owner[out.request_id]
            if out.finish_reason is not None:
                del self.owner[out.request_id]
            out.request_id = rid
            self.pending[identity].append(out)
        self._idle_checked = False

    def _flush_pending(self) -> None:
        pending, self.pending = self.pending, defaultdict(list)  # a send may drop a gateway
        for identity, outs in pending.items():
            if outs:
                self._send_step_output(identity, outs)

    def _send_step_output(self, identity: bytes, outs: list[RequestOutput]) -> None:
        arrays: list[list[int]] = []
        step = pb.StepOutput(step=self.num_steps)
        for o in outs:
            ro = step.outputs.add(
                request_id=o.request_id, finish_reason=FINISH_REASON_TO_WIRE[o.finish_reason],
                num_prompt_tokens=o.num_prompt_tokens, num_completion_tokens=o.num_completion_tokens,
                num_cached_tokens=o.num_cached_tokens,
                num_draft_tokens=getattr(o, "num_draft_tokens", 0),
                num_accepted_draft_tokens=getattr(o, "num_accepted_draft_tokens", 0),
                num_accepted_prediction_tokens=getattr(o, "num_accepted_prediction_tokens", 0),
                num_rejected_prediction_tokens=getattr(o, "num_rejected_prediction_tokens", 0))
            if self.pin_status:
                pin = self.pin_status.pop((identity, o.request_id), 0)
                if pin:
                    ro.pin_status = pin
            if o.new_token_ids:
                ro.tokens_frame = len(arrays)
                arrays.append(o.new_token_ids)
            else:
                ro.tokens_frame = codec.NO_FRAME
            for lp in o.logprobs:
                ro.logprobs.add(logprob=lp.logprob, top_ids=lp.top_ids, top_logprobs=lp.top_logprobs)
        self._send(identity, pb.Envelope(step_output=step), arrays)

    def _send(self, identity: bytes, envelope: pb.Envelope, arrays=()) -> None:
        frames = [identity, *codec.encode_trusted(envelope, arrays)]
        box = self.outbox.get(identity)
        if box is not None:  # keep the order: behind what already waits
            self._hold(identity, box, frames)
            return
        self._send_now(identity, frames)

    def _send_now(self, identity: bytes, frames: list) -> bool:
        """True when sent; False when held back or the peer was dropped."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.Again:  # its queue is full (high-water mark): hold, send when there is room
            self._hold(identity, self.outbox.setdefault(identity, deque()), frames)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:  # the gateway disconnected
                self._drop_gateway(identity, "disconnected")
            else:
                print(f"tidegate backend: could not send to a gateway: {exc}", file=sys.stderr)
        return False

    def _hold(self, identity: bytes, box: deque, frames: list) -> None:
        self.num_backpressured += 1
        if len(box) >= self.max_held_messages:
            self._drop_gateway(identity, f"not reading ({len(box)} messages held)")
            return
        box.append(frames)

    def _flush_outboxes(self) -> None:
        for identity in list(self.outbox):
            box = self.outbox.get(identity)
            while box:
                frames = box.popleft()
                try:
                    self.sock.send_multipart(frames, zmq.NOBLOCK)
                except zmq.Again:
                    box.appendleft(frames)
                    break
                except zmq.ZMQError:
                    self._drop_gateway(identity, "disconnected")
                    break
            if not box:
                self.outbox.pop(identity, None)

    def _drop_gateway(self, identity: bytes, reason: str) -> None:
        """Forget a gateway that left or stopped reading: abort its requests (their KV blocks
        return to the pool) and drop what was held for it."""
        self.outbox.pop(identity, None)
        self.pending.pop(identity, None)
        if identity not in self.gateways and not any(i == identity for i, _ in self.owner.values()):
            return
        self.gateways.discard(identity)
        self.num_gateways_dropped += 1
        keys = [k for k, (i, _) in self.owner.items() if i == identity]
        for key in keys:
            self.engine.abort(key)
            del self.owner[key]
        keys += [p.key for p in self.puller.cancel_identity(identity)]
        print(f"tidegate backend: dropped gateway {identity.hex()} ({reason}); aborted "
              f"{len(keys)} requests", file=sys.stderr)

    def _maybe_report(self) -> None:
        now = time.monotonic()
        busy = self.engine.has_unfinished()
        interval = BUSY_REPORT_S if busy else IDLE_REPORT_S
        # A busy -> idle edge is reported at once: the gateway's idle flush waits for it, and a
        # lone request would otherwise sit in the batching window until the next 1 s report.
        became_idle = self._was_busy and not busy
        self._was_busy = busy
        if now - self._last_report < interval and not became_idle:
            return
        self._last_report = now
        if not self.gateways:
            return
        env = pb.Envelope(load_report=self.load_report())
        for identity in list(self.gateways):  # a send may drop a gateway that left
            self._send(identity, env)

    def _check_idle(self) -> None:
        self._idle_checked = True
        try:
            self.engine.check_integrity()
        except AssertionError as exc:
            print(f"tidegate backend: integrity check failed while idle: {exc}", file=sys.stderr)

    # ---- messages ------------------------------------------------------------------------
    def backend_info(self) -> pb.BackendInfo:
        tok = self.loaded.tokenizer
        cfg = self.engine.config
        info = pb.BackendInfo(
            protocol_version=codec.PROTOCOL_VERSION, model=self.model_name,
            max_model_len=cfg.max_model_len, vocab_size=self.loaded.config.vocab_size,
            block_size=cfg.block_size, num_kv_blocks=cfg.num_blocks, role=self.role,
            tokenizer_json=tok.tokenizer_json, chat_template=tok.chat_template or "",
            eos_token_ids=list(self.engine.eos_token_ids), backend_id=self.backend_id,
            kv_cache_dtype=self.engine.kv_cache_dtype,
            enable_prefix_caching=cfg.enable_prefix_caching, engine=f"tidegate {ENGINE_VERSION}",
            # the gateway's slot model counts on it from the start (issue 31)
            max_num_seqs=int(getattr(cfg, "max_num_seqs", 0) or 0))
        if tok.bos_token_id is not None:
            info.bos_token_id = tok.bos_token_id
        info.generation_defaults.update(self.generation_defaults)
        port = self.puller.port
        if port is not None:  # prefix pull (issue 34): what we store, what copies cost
            info.kv_layout, info.kv_block_bytes = port.layout, port.block_bytes
            info.kv_copy_bytes_per_s = port.copy_bytes_per_s
            if self.kv_server is not None:
                info.kv_endpoint = self.kv_server.endpoint
        return info

    def load_report(self) -> pb.LoadReport:
        load = self.engine.load()
        report = pb.LoadReport(
            num_running=load.num_running, num_waiting=load.num_waiting,
            num_free_blocks=load.num_free_blocks, num_total_blocks=load.num_total_blocks,
            recent_step_time_ms=self.step_time_ema_ms, backend_id=self.backend_id,
            num_outstanding_tokens=load.num_outstanding_tokens,
            num_preemptions=load.num_preemptions,
            num_held_messages=self.num_backpressured,
            num_dropped_peers=self.num_gateways_dropped,
            num_swap_preemptions=load.num_swap_preemptions,
            num_prompt_tokens=load.num_prompt_tokens,
            num_cached_prompt_tokens=load.num_cached_prompt_tokens)
        if load.num_host_blocks:
            report.num_host_hit_tokens = load.num_host_hit_tokens
            report.num_host_blocks = load.num_host_blocks
            report.num_host_used_blocks = load.num_host_used_blocks
        if load.pin_budget_blocks:
            report.num_pins, report.num_pinned_blocks = load.num_pins, load.num_pinned_blocks
            report.pin_budget_blocks = load.pin_budget_blocks
            report.num_pins_refused, report.num_pins_expired = (load.num_pins_refused,
                                                                load.num_pins_expired)
        for c in load.spec_decode:  # speculative decoding by draft source (issue 28)
            report.spec_decode.add(
                source=c.source, num_drafts=c.num_drafts, num_draft_tokens=c.num_draft_tokens,
                num_accepted_tokens=c.num_accepted_tokens,
                num_accepted_tokens_per_pos=c.num_accepted_tokens_per_pos)
        puller = self.puller
        served = puller.num_served + (self.kv_server.num_served if self.kv_server else 0)
        if puller.num_pulls or served:
            report.num_kv_pulls, report.num_kv_pull_failures = (puller.num_pulls,
                                                                puller.num_failures)
            report.num_kv_pulled_tokens = puller.num_pulled_tokens
            report.num_kv_pulls_served = served
            report.kv_pull_bytes_per_s = puller.bytes_per_s
            report.num_kv_pulls_ipc = puller.num_ipc_pulls
        report.prefill_tokens_per_s = puller.prefill_tokens_per_s
        if self.prefix_summary is not None:
            report.prefix_hashes.extend(self.prefix_summary.snapshot(self._is_cached))
            report.prefix_block_size = self.engine.config.block_size
        return report
