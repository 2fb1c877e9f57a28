"""The gateway's ZMQ front door: a ROUTER speaking the backend protocol to `gateway.client`.

    client DEALER ── Hello ──────────────► BackendInfo (model, limits, tokenizer)
                  ── Batch(GenerateRequest: prompt_frame ids | prompt_text, sampling) ─►
                  ◄─ StepOutput(RequestOutput: new token ids, finish_reason) ... ─────
                  ── Abort(request_ids) ─► the request leaves the queue / its backend
                  ◄─ Error(code, message, request_id) for refused or failed requests

Requests take the same path as HTTP ones (validation, class queues, batcher, backend pool);
ids are the client's own, namespaced per connection inside the gateway. Outputs for one client
are coalesced into one StepOutput per event-loop turn. Hello is optional, so a client whose
gateway restarted just carries on. Malformed messages are answered with Error{BAD_MESSAGE}
and counted; nothing is ever unpickled.
"""
from __future__ import annotations

import asyncio
import errno
import hmac
import logging
from collections import deque
from dataclasses import replace

import zmq
import zmq.asyncio
from aiohttp import web

from gateway.app_keys import GATEWAY_KEY
from gateway.body_checks import LIMITS, RequestLimits
from gateway.core import Gateway, RequestHandle
from gateway.errors import APIError, bad_request
from gateway.frontdoor_structured import structured_from_wire
from gateway.openai_schema import ServingOptions, SpeculationControl
from gateway.prediction_fields import (
    check_prediction_tokens,
    parse_prediction,
    parse_speculation,
)
from gateway.request_fields import MAX_LOGPROBS
from gateway.sampling_fields import check_request_sampling
from gateway.sessions import session_from_wire
from gateway.structured import check_grammar
from gateway.validation import check_context_length
from gateway.zmqio import SocketReader
from proto import codec
from proto import tidegate_pb2 as pb
from proto.convert import FINISH_REASON_TO_WIRE
from proto.sampling import SamplingParams, from_wire
from proto.security import CurveKeys, check_bind, start_authenticator

log = logging.getLogger("tidegate.gateway.frontdoor")
MAX_CLIENT_MESSAGE_BYTES = 16 << 20  # a larger message from a client closes its connection

# Messages held for a client whose socket queue is full; past this it is not reading, and its
# requests are aborted (see _hold).
MAX_HELD_PER_CLIENT = 4096
CLIENT_QUEUE_MESSAGES = 1000  # libzmq's per-client send queue (SNDHWM) before EAGAIN
RETRY_HELD_S = 0.005


def error_code(err: APIError) -> int:
    if err.status == 400:
        return pb.Error.INVALID_REQUEST
    if err.status == 504:
        return pb.Error.DEADLINE
    if err.code == "shutting_down":
        return pb.Error.SHUTTING_DOWN
    if err.status in (429, 503):
        return pb.Error.CAPACITY
    return pb.Error.INTERNAL


# Checked sampling parameters by their wire bytes (and limits): a client sends the same few
# settings over and over, and checking them field by field was a quarter of the front door's
# CPU per 1-token request. SamplingParams is frozen, so one record serves every request.
# Only successes are kept; a full cache starts over (a client varying seeds per request
# gets no hits, and pays one dict clear per SAMPLING_CACHE_SIZE requests).
SAMPLING_CACHE_SIZE = 1024
_sampling_cache: dict[tuple[bytes, RequestLimits], SamplingParams] = {}


def speculation_from_wire(req: pb.GenerateRequest, limits: RequestLimits = LIMITS
                          ) -> SpeculationControl | None:
    """The request's SpeculationParams, checked as the HTTP field is; None when unset."""
    if not req.HasField("speculation"):
        return None
    s = req.speculation
    if s.off:
        return SpeculationControl(off=True)
    if s.max_draft_tokens == 0:
        return None
    return parse_speculation({"speculation": {"max_draft_tokens": s.max_draft_tokens}}, limits)


def sampling_from_wire(s: pb.SamplingParams, limits: RequestLimits = LIMITS
                       ) -> SamplingParams:
    """The wire's sampling parameters, checked by the same code as an HTTP body's."""
    key = (s.SerializeToString(deterministic=True), limits)
    cached = _sampling_cache.get(key)
    if cached is not None:
        return cached
    params = _check_wire_sampling(s, limits)
    if len(_sampling_cache) >= SAMPLING_CACHE_SIZE:
        _sampling_cache.clear()
    _sampling_cache[key] = params
    return params


def _check_wire_sampling(s: pb.SamplingParams, limits: RequestLimits) -> SamplingParams:
    if s.logprobs > MAX_LOGPROBS:
        raise bad_request(f"logprobs must be at most {MAX_LOGPROBS}.", "logprobs")
    if s.n > 1:
        raise bad_request("n > 1 is not served at the ZMQ front door; send n requests.", "n")
    # s.grammar is read by FrontDoor._submit (gateway.frontdoor_structured), not here
    # the one conversion and the HTTP body's checks (the gateway's limits, check_sampling)
    return check_request_sampling(from_wire(s), limits)


class FrontDoor:
    def __init__(self, gateway: Gateway, address: str, curve: CurveKeys | None = None,
                 insecure: bool = False, *, max_held_per_client: int = MAX_HELD_PER_CLIENT,
                 client_queue_messages: int = CLIENT_QUEUE_MESSAGES,
                 send_buffer_bytes: int = 0) -> None:
        """`max_held_per_client`: messages held for a client whose queue is full before it is
        dropped as not reading; `client_queue_messages`: libzmq's queue per client (SNDHWM);
        `send_buffer_bytes`: the kernel's TCP send buffer per client (0: the OS default, which
        grows to MiBs: that much is buffered before back-pressure shows)."""
        check_bind(address, curve, insecure)
        self.gateway = gateway
        self.max_held_per_client = max_held_per_client
        self._ctx = zmq.asyncio.Context()
        self.sock = self._ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self._auth = None
        if curve is not None and address.startswith("tcp://"):
            self._auth = start_authenticator(self._ctx, curve.allow_dir)
            curve.apply_server(self.sock)
        # With --api-key, a connection must say Hello with the key before it may submit.
        self._api_key = gateway.config.api_key
        self._authenticated: set[bytes] = set()
        # A full or vanished client is reported (EAGAIN / EHOSTUNREACH) instead of its
        # messages being dropped in silence; see _send.
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.SNDHWM, client_queue_messages)  # read at bind time
        if send_buffer_bytes:
            self.sock.setsockopt(zmq.SNDBUF, send_buffer_bytes)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_CLIENT_MESSAGE_BYTES)
        self.sock.bind(address)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.num_dropped = 0
        self._handles: dict[str, RequestHandle] = {}  # internal id -> handle
        self._tasks: set[asyncio.Task] = set()
        self._compiling: dict[str, asyncio.Task] = {}  # internal id -> its grammar's check
        self._outbox: dict[bytes, tuple[pb.StepOutput, list]] = {}
        self._flush_scheduled = False
        self._held: dict[bytes, deque[list]] = {}  # client -> frames waiting for room
        self._retry_timer: asyncio.TimerHandle | None = None
        self._io = SocketReader(self.sock, self._on_message)

    def start(self) -> None:
        self._io.start()

    async def close(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        self._io.stop()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.sock.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.destroy(linger=0)

    # --- sending ----------------------------------------------------------------------------------
    def _send(self, peer: bytes, env: pb.Envelope, arrays=()) -> None:
        frames = codec.encode_trusted(env, arrays)
        frames.insert(0, peer)
        held = self._held.get(peer)
        if held is not None:  # keep the order: behind what already waits
            self._hold(peer, held, frames)
        elif not self._io.send(frames):
            self._send_failed(peer, frames)

    def _send_failed(self, peer: bytes, frames: list) -> None:
        if self._io.last_errno == errno.EAGAIN:  # the client's queue is full: hold and retry
            self._hold(peer, self._held.setdefault(peer, deque()), frames)
        elif self._io.last_errno == errno.EHOSTUNREACH:
            self._drop_client(peer, "disconnected")
        else:
            log.debug("could not send to a client (errno %d)", self._io.last_errno)

    def _hold(self, peer: bytes, held: deque, frames: list) -> None:
        self.gateway.metrics.frontdoor_backpressure.inc()
        if len(held) >= self.max_held_per_client:
            self._drop_client(peer, "not reading")
            return
        held.append(frames)
        if self._retry_timer is None:
            loop = asyncio.get_running_loop()
            self._retry_timer = loop.call_later(RETRY_HELD_S, self._send_held)

    def _send_held(self) -> None:
        self._retry_timer = None
        for peer in list(self._held):
            held = self._held.get(peer)
            while held:
                if not self._io.send(held[0]):
                    if self._io.last_errno != errno.EAGAIN:
                        self._drop_client(peer, "disconnected")
                    break
                held.popleft()
            if held is not None and not held:
                self._held.pop(peer, None)
        if self._held and self._retry_timer is None:
            self._retry_timer = asyncio.get_running_loop().call_later(RETRY_HELD_S,
                                                                      self._send_held)

    def _drop_client(self, peer: bytes, reason: str) -> None:
        """A client left or stopped reading: abort its requests (their KV is freed)."""
        self._held.pop(peer, None)
        self._authenticated.discard(peer)
        self._outbox.pop(peer, None)
        prefix = self._internal_id(peer, "")
        handles = [h for rid, h in self._handles.items() if rid.startswith(prefix)]
        for rid in [rid for rid in self._compiling if rid.startswith(prefix)]:
            self._compiling.pop(rid).cancel()
        self.gateway.metrics.frontdoor_dropped_clients.labels(reason).inc()
        log.info("front door: client %s %s; aborting %d requests", peer.hex(), reason,
                 len(handles))
        for h in handles:
            h.close()

    def _queue_output(self, peer: bytes, request_id: str, num_prompt: int, num_completion: int,
                      finish_reason: int, logprobs, token_ids: list[int],
                      handle: RequestHandle | None = None) -> None:
        """One request's delta into its client's next StepOutput (built in place: a separate
        RequestOutput copied in cost a message construction and a CopyFrom per delta)."""
        box = self._outbox.get(peer)
        if box is None:
            box = self._outbox[peer] = (pb.StepOutput(), [])
        step, arrays = box
        entry = step.outputs.add(request_id=request_id, num_prompt_tokens=num_prompt,
                                 num_completion_tokens=num_completion,
                                 finish_reason=finish_reason, tokens_frame=len(arrays))
        if logprobs is not None:
            for lp, top_ids, top_lps in logprobs:
                entry.logprobs.add(logprob=lp, top_ids=top_ids, top_logprobs=top_lps)
        if handle is not None and (handle.num_draft_tokens or handle.prediction_ids is not None):
            entry.num_draft_tokens = handle.num_draft_tokens  # cumulative, as the backend's
            entry.num_accepted_draft_tokens = handle.num_accepted_draft_tokens
            if finish_reason != pb.RequestOutput.NONE:  # the usage details, as HTTP's
                accepted, rejected = handle.prediction_usage()
                entry.num_accepted_prediction_tokens = accepted
                entry.num_rejected_prediction_tokens = rejected
        if handle is not None and (handle.cached_tokens or handle.pin_status):  # issue 30
            entry.num_cached_tokens = handle.cached_tokens
            entry.pin_status = handle.pin_status
        arrays.append(token_ids)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, {}
        for peer, (step, arrays) in outbox.items():
            self._send(peer, pb.Envelope(step_output=step), arrays)

    # --- receiving --------------------------------------------------------------------------------
    def _on_message(self, frames: list) -> None:
        peer = frames[0].bytes
        try:
            self._handle(peer, codec.decode(frames[1:]))
        except codec.DecodeError as exc:
            self.num_dropped += 1
            self.gateway.metrics.dropped_frames.labels("frontdoor").inc()
            # Named where it can be read, so a client stops waiting for exactly those requests.
            ids = codec.peek_request_ids(frames[1:])
            batch_id = codec.peek_batch_id(frames[1:])
            for rid in ids:
                self._send(peer, codec.make_error(pb.Error.BAD_MESSAGE, str(exc), rid, batch_id))
            if not ids:
                self._send(peer, codec.error_for(exc, batch_id))
        except Exception:
            self.num_dropped += 1
            log.exception("error handling a front-door message")
            self._send(peer, codec.make_error(pb.Error.INTERNAL, "internal error"))

    def _handle(self, peer: bytes, decoded: codec.Decoded) -> None:
        env, kind = decoded.envelope, decoded.kind
        if kind == "hello":
            codec.check_version(env.hello.protocol_version)
            if self._api_key is not None:
                if not hmac.compare_digest(env.hello.api_key.encode(), self._api_key.encode()):
                    self._authenticated.discard(peer)
                    self._send(peer, codec.make_error(pb.Error.UNAUTHENTICATED,
                                                      "Invalid or missing API key."))
                    return
                self._authenticated.add(peer)
            self._send(peer, self._info_envelope())
        elif kind == "batch":
            if self._api_key is not None and peer not in self._authenticated:
                for req in env.batch.requests:
                    self._send(peer, codec.make_error(
                        pb.Error.UNAUTHENTICATED, "Say Hello with the API key first.",
                        req.request_id))
                return
            for req in env.batch.requests:
                self._submit(peer, req, decoded)
        elif kind == "abort":
            for rid in env.abort.request_ids:
                handle = self._handles.get(self._internal_id(peer, rid))
                if handle is not None:
                    handle.close()
                check = self._compiling.pop(self._internal_id(peer, rid), None)
                if check is not None:  # still compiling its grammar: never queued
                    check.cancel()
        elif kind == "health":
            if not env.health.reply:
                self._send(peer, codec.make_health(env.health.nonce, env.health.time, True))
        else:
            self._send(peer, codec.make_error(pb.Error.BAD_MESSAGE,
                                              f"unexpected message {kind!r} at the front door"))

    def _info_envelope(self) -> pb.Envelope:
        gw = self.gateway
        if gw.pool.info is None:
            return codec.make_error(pb.Error.CAPACITY, "no backend has introduced itself yet")
        info = pb.BackendInfo()
        info.CopyFrom(gw.info)
        info.model = gw.model_name
        info.protocol_version = codec.PROTOCOL_VERSION
        return pb.Envelope(backend_info=info)

    @staticmethod
    def _internal_id(peer: bytes, request_id: str) -> str:
        return f"zmq-{peer.hex()}-{request_id}"

    def _submit(self, peer: bytes, req: pb.GenerateRequest, decoded: codec.Decoded) -> None:
        gw = self.gateway
        try:
            if not req.request_id:
                raise bad_request("request_id is required.", "request_id")
            sampling = sampling_from_wire(req.sampling, gw.config.limits)
            gw.check_admission()
            ids = codec.array_of(decoded, req.prompt_frame)
            if ids is not None and len(ids):
                prompt_ids = ids.tolist()
                vocab = gw.info.vocab_size
                if min(prompt_ids) < 0 or (vocab and max(prompt_ids) >= vocab):
                    raise bad_request("prompt token id out of range.", "prompt")
            elif req.prompt_text and req.suffix:
                prompt_ids = gw.fim_prompt(req.prompt_text, req.suffix)
            elif req.prompt_text:
                prompt_ids = gw.bundle.encode(req.prompt_text)
            else:
                raise bad_request("the prompt is empty.", "prompt")
            check_context_length(len(prompt_ids), sampling.max_tokens, gw.info.max_model_len)
            gw.check_token_params(sampling)
            prediction_ids = self._prediction(req, decoded)
            grammar, param = structured_from_wire(req)
            internal = self._internal_id(peer, req.request_id)
            if internal in self._handles or internal in self._compiling:
                raise bad_request(f"request id {req.request_id!r} is already in use.",
                                  "request_id")
            options = ServingOptions(priority=req.priority,
                                     speculation=speculation_from_wire(req, gw.config.limits),
                                     **session_from_wire(req))
            if grammar is not None:  # compiled off the loop first, as an HTTP request's
                args = (internal, prompt_ids, replace(sampling, grammar=grammar),
                        options, prediction_ids)
                self._check_grammar_then_submit(peer, req.request_id, param, args)
                return
            handle = gw.submit(internal, prompt_ids, sampling, sampling.max_tokens, options,
                               prediction_ids)
        except APIError as err:
            self._refuse(peer, req.request_id, err)
            return
        self._start(peer, req.request_id, internal, handle)

    def _refuse(self, peer: bytes, request_id: str, err: APIError) -> None:
        self.gateway.metrics.observe_request(err.status, "none")
        env = codec.make_error(error_code(err), err.message, request_id)
        env.error.param = err.param or ""
        self._send(peer, env)

    def _check_grammar_then_submit(self, peer: bytes, request_id: str, param: str | None,
                                   args: tuple) -> None:
        """Submit once the grammar compiles against the backend's vocabulary (a 400 naming
        `param` when it does not); an abort or a departing client cancels the check."""
        internal, prompt_ids, sampling, options, prediction_ids = args

        async def check_then_submit() -> None:
            try:
                await check_grammar(self.gateway, sampling.grammar, param)
                handle = self.gateway.submit(internal, prompt_ids, sampling, sampling.max_tokens,
                                             options, prediction_ids)
            except APIError as err:
                self._refuse(peer, request_id, err)
                return
            finally:
                if self._compiling.get(internal) is asyncio.current_task():
                    del self._compiling[internal]
            self._start(peer, request_id, internal, handle)

        task = asyncio.create_task(check_then_submit())
        self._compiling[internal] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start(self, peer: bytes, request_id: str, internal: str,
               handle: RequestHandle) -> None:
        gw = self.gateway
        self._handles[internal] = handle
        gw.metrics.frontdoor_open.inc()
        task = asyncio.create_task(self._pump(peer, request_id, handle))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _prediction(self, req: pb.GenerateRequest, decoded: codec.Decoded) -> list[int] | None:
        """The request's prediction ids: its frame's (checked against the vocabulary), or its
        text tokenized here, with the HTTP API's limits; None without one."""
        gw = self.gateway
        if req.HasField("prediction_frame"):
            if req.prediction_text:
                raise bad_request("give the prediction as ids or as text, not both.",
                                  "prediction")
            arr = codec.array_of(decoded, req.prediction_frame)
            ids = [] if arr is None else arr.tolist()
            vocab = gw.info.vocab_size
            if ids and (min(ids) < 0 or (vocab and max(ids) >= vocab)):
                raise bad_request("prediction token id out of range.", "prediction")
            check_prediction_tokens(len(ids), gw.info.max_model_len)
            return ids
        if req.prediction_text:
            limits = gw.config.limits
            text = parse_prediction({"prediction": {"type": "content",
                                                    "content": req.prediction_text}}, limits)
            return gw.tokenize_prediction(text)
        return None

    async def _pump(self, peer: bytes, request_id: str, handle: RequestHandle) -> None:
        """Forward one request's outputs to its client (token ids; the client detokenizes)."""
        gw = self.gateway
        status = 499
        num_prompt = len(handle.prompt_ids)
        try:
            generated = handle.assembler.token_ids
            to_wire, none = FINISH_REASON_TO_WIRE.get, pb.RequestOutput.NONE
            async for delta in handle.deltas(1):
                self._queue_output(peer, request_id, num_prompt, len(generated),
                                   to_wire(delta.finish_reason, none), delta.logprobs,
                                   delta.token_ids, handle)
            status = 200
        except APIError as err:
            status = err.status
            if err.code != "cancelled":  # an aborted request's client has stopped listening
                self._send(peer, codec.make_error(error_code(err), err.message, request_id))
        finally:
            self._handles.pop(self._internal_id(peer, request_id), None)
            gw.metrics.frontdoor_open.dec()
            handle.close()
            gw.record(handle, status)


def frontdoor_ctx(address: str, curve: CurveKeys | None = None, insecure: bool = False,
                  **limits):
    """A cleanup_ctx entry that runs the front door with the app (after the gateway core);
    `limits`: FrontDoor's keyword arguments."""
    async def ctx(app: web.Application):
        door = FrontDoor(app[GATEWAY_KEY], address, curve, insecure, **limits)
        door.start()
        app[FRONTDOOR_KEY] = door
        yield
        await door.close()
    return ctx


FRONTDOOR_KEY = web.AppKey("frontdoor", FrontDoor)
