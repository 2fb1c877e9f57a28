"""Client library for the gateway's ZMQ front door (`tidegate serve --zmq-listen ADDR`).

    from gateway.client import Client, AsyncClient

    with Client("tcp://127.0.0.1:5556") as c:
        print(c.generate("def fib(n):", max_tokens=32, temperature=0).text)
        for delta in c.stream("def fib(n):", max_tokens=32):
            print(delta.text, end="", flush=True)

    async with AsyncClient("tcp://127.0.0.1:5556") as c:
        result = await c.generate([1, 2, 3], max_tokens=8)
        async for delta in c.stream("hello", max_tokens=8):   # leaving the loop aborts it
            ...

The gateway sends token ids; the client detokenizes them with the tokenizer from the gateway's
BackendInfo (incrementally, UTF-8 safe, stop strings applied exactly as the HTTP API does).
Errors are typed (`InvalidRequestError`, `CapacityError`, `DeadlineError`, ...) and carry the
server's error code. ZMQ reconnects by itself, so a client outlives a gateway restart.
`Client` is for one thread; `AsyncClient` for one event loop. Both have the same surface:
`generate(prompt, **params) -> Completion` and `stream(prompt, **params)` yielding `Delta`s
(`await` / `async for` on the AsyncClient). `params` are the HTTP API's names
(`REQUEST_FIELDS`: sampling controls, `stop`, `logprobs`, `echo`, `suffix` for FIM, ...);
`Completion` carries what an HTTP completion choice and its usage carry, logprobs and their
text offsets included. `n > 1` is HTTP-only (send n requests over ZMQ). Structured output takes
the HTTP names too (`response_format`, `structured_outputs`, `guided_json`, `guided_regex`,
`guided_choice`, `guided_grammar`): the gateway checks them as it checks an HTTP body, and a bad
one raises `InvalidRequestError` with the HTTP error's message and `param`.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from gateway.output import OutputAssembler
from proto import codec
from proto import tidegate_pb2 as pb
from proto.convert import FINISH_REASON_FROM_WIRE
from proto.sampling import API_DEFAULTS, SamplingParams, to_wire
from proto.security import SecurityError, keys_from_args
from tokenizer.bundle import TokenizerBundle

if TYPE_CHECKING:  # typing.Self is 3.11+; annotations are never evaluated at run time here
    from typing_extensions import Self

# What stream()/generate() take, as the HTTP API names them (README: supported parameters).
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "ignore_eos",
                   "logprobs", "stop", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "logit_bias", "min_tokens", "stop_token_ids",
                   "skip_special_tokens", "include_stop_str_in_output")
# `prediction`: Predicted Outputs, the expected completion as text, token ids, or OpenAI's
# {"type": "content", "content": ...}; `speculation`: "off", "auto" or {"max_draft_tokens": k}.
# session_key: a session key (HTTP's prompt_cache_key / agent session headers); pin_ttl_s: pin
# the prompt's KV on its backend that long (HTTP's cache_control), pin_tokens: its first N only
# Structured output, as the HTTP API names it; sent as GenerateRequest.structured_fields (JSON)
# and checked at the gateway by the HTTP API's code (gateway.frontdoor_structured)
STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex",
                     "guided_choice", "guided_grammar", "guided_decoding_backend",
                     "guided_whitespace_pattern")
REQUEST_FIELDS = SAMPLING_FIELDS + ("suffix", "echo", "prediction", "speculation", "session_key",
                                    "pin_ttl_s", "pin_tokens") + STRUCTURED_FIELDS


class TidegateError(Exception):
    """An error from the gateway (or the connection); `code` is the proto Error.Code name,
    `param` the request field an invalid request names (the HTTP error's), None for none."""

    def __init__(self, message: str, code: str = "UNKNOWN", request_id: str = "",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id
        self.param = param


class InvalidRequestError(TidegateError): ...
class CapacityError(TidegateError): ...
class DeadlineError(TidegateError): ...
class ShuttingDownError(TidegateError): ...
class ServerError(TidegateError): ...
class RequestTimeout(TidegateError, TimeoutError): ...


class AuthenticationError(TidegateError): ...


ERRORS = {pb.Error.INVALID_REQUEST: InvalidRequestError, pb.Error.CAPACITY: CapacityError,
          pb.Error.DEADLINE: DeadlineError, pb.Error.SHUTTING_DOWN: ShuttingDownError,
          pb.Error.UNAUTHENTICATED: AuthenticationError}


def error_from_wire(err: pb.Error) -> TidegateError:
    cls = ERRORS.get(err.code, ServerError)
    return cls(err.message, pb.Error.Code.Name(err.code), err.request_id, err.param or None)


@dataclass(slots=True)
class TopLogprob:
    token_id: int
    token: str  # the token decoded alone
    logprob: float


@dataclass(slots=True)
class TokenLogprob:
    """One generated token's logprob and the top alternatives (`logprobs=N`), as HTTP's."""
    token_id: int
    token: str
    logprob: float
    top_logprobs: list[TopLogprob]


@dataclass(slots=True)
class Delta:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    request_id: str = ""
    num_prompt_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None  # one per token in token_ids, with logprobs=N
    # speculative decoding so far (cumulative, as the gateway reports it): draft tokens
    # verified and accepted; the prediction's tokens used and not used (OpenAI's usage details)
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (issue 30)
    pin_status: int = 0  # RequestOutput.PinStatus of a pin asked for (0: none / not yet)


@dataclass(slots=True)
class Completion:
    """What HTTP's completion choice + usage carry: text (with the prompt first under echo),
    token ids, finish reason, token counts, logprobs with text offsets into `text`."""
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    num_prompt_tokens: int
    num_completion_tokens: int
    logprobs: list[TokenLogprob] | None = None
    text_offsets: list[int] | None = None  # where each token's text starts in `text`
    prompt_token_ids: list[int] | None = None  # None for a FIM (suffix) request
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified
    num_accepted_draft_tokens: int = 0  # of which accepted
    accepted_prediction_tokens: int = 0  # prediction tokens the output used (OpenAI's usage)
    rejected_prediction_tokens: int = 0  # prediction tokens it did not use
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (issue 30)
    pin: str | None = None  # a pin asked for: "pinned", "over_budget" or "unsupported"


class _Base:
    """What both clients share: the request message, the tokenizer, the output assembly."""

    def __init__(self, address: str, timeout: float, connect_timeout: float,
                 curve_key: str | None = None, server_key: str | None = None,
                 api_key: str | None = None) -> None:
        self.address = address
        # CURVE for a tcp:// front door: our key pair (.key_secret file) and the gateway's public
        # key file; the API key goes in the Hello (never in a log or an exception message).
        self._curve = keys_from_args(curve_key, server_key) if curve_key else None
        if self._curve is None and server_key:
            raise SecurityError("server_key needs curve_key (this client's key pair) as well")
        self._api_key = api_key or ""
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.info: pb.BackendInfo | None = None
        self.bundle: TokenizerBundle | None = None
        self._ids = itertools.count()
        self._prefix = os.urandom(4).hex()

    def _set_info(self, info: pb.BackendInfo) -> None:
        if not info.tokenizer_json:  # its backends are HTTP servers and it was given no tokenizer
            raise InvalidRequestError(
                "The gateway has no tokenizer to give this client: its backends are "
                "OpenAI-compatible HTTP servers and it was started without --tokenizer DIR. Use "
                "its HTTP API, or start it with --tokenizer.", "INVALID_REQUEST")
        self.info = info
        self.bundle = TokenizerBundle.from_parts(
            info.tokenizer_json, info.chat_template or None,
            info.bos_token_id if info.HasField("bos_token_id") else None,
            tuple(info.eos_token_ids), info.model)

    def _socket(self, ctx) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, codec.MAX_FRAME_BYTES)
        if self._curve is not None and self.address.startswith("tcp://"):
            self._curve.apply_client(sock)
        sock.connect(self.address)
        return sock

    def _hello(self) -> list[bytes]:
        env = codec.make_hello("client", pb.Hello.CLIENT)
        env.hello.api_key = self._api_key
        return codec.encode(env)

    @property
    def model(self) -> str:
        return self.info.model if self.info else ""

    def _request(self, prompt: str | list[int], sampling: dict) -> tuple[str, list[bytes]]:
        unknown = set(sampling) - set(REQUEST_FIELDS)
        if unknown:
            raise TypeError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        rid = f"{self._prefix}-{next(self._ids)}"
        get = sampling.get
        stop = get("stop") or []
        skip_special = get("skip_special_tokens")
        # the one record and its one conversion (proto.sampling), with the HTTP API's defaults;
        # the gateway checks it as it checks an HTTP body
        sp = to_wire(SamplingParams(
            max_tokens=get("max_tokens", 16),
            temperature=get("temperature", API_DEFAULTS["temperature"]),
            top_p=get("top_p", 1.0), top_k=get("top_k", 0), seed=get("seed"),
            stop_token_ids=tuple(get("stop_token_ids") or ()),
            ignore_eos=get("ignore_eos", False), logprobs=get("logprobs") or None,
            min_p=get("min_p", 0.0), repetition_penalty=get("repetition_penalty", 1.0),
            presence_penalty=get("presence_penalty", 0.0),
            frequency_penalty=get("frequency_penalty", 0.0),
            logit_bias=tuple((int(k), float(v)) for k, v in (get("logit_bias") or {}).items()),
            min_tokens=get("min_tokens", 0), stop=(stop,) if isinstance(stop, str) else tuple(stop),
            skip_special_tokens=True if skip_special is None else skip_special,
            include_stop_str_in_output=get("include_stop_str_in_output", False)),
            output_options=True)
        req = pb.GenerateRequest(request_id=rid, sampling=sp, prompt_frame=codec.NO_FRAME,
                                 suffix=get("suffix") or "")
        arrays = []
        if isinstance(prompt, str):
            req.prompt_text = prompt
        else:
            req.prompt_frame = 0
            arrays.append(list(prompt))
        prediction = get("prediction")
        if isinstance(prediction, dict):  # OpenAI's shape: the gateway checks the type
            content = prediction.get("content")
            if prediction.get("type") != "content":
                raise ValueError("prediction: want {'type': 'content', 'content': ...}")
            prediction = content if isinstance(content, str) else "".join(
                p.get("text", "") for p in content or [])
        if isinstance(prediction, str):
            req.prediction_text = prediction
        elif prediction is not None:
            req.prediction_frame = len(arrays)
            arrays.append(list(prediction))
        speculation = get("speculation")
        if speculation == "off":
            req.speculation.off = True
        elif isinstance(speculation, dict):
            k = speculation.get("max_draft_tokens")
            if k is not None:
                req.speculation.max_draft_tokens = k
                req.speculation.off = k == 0
        elif speculation not in (None, "auto"):
            raise ValueError("speculation: want 'off', 'auto' or {'max_draft_tokens': k}")
        if get("session_key"):
            req.session_key = sampling["session_key"]
        if get("pin_ttl_s"):  # the gateway checks the bounds, as HTTP's cache_control
            req.pin_ttl_s = sampling["pin_ttl_s"]
            req.pin_tokens = get("pin_tokens") or 0
        structured = {k: sampling[k] for k in STRUCTURED_FIELDS if get(k) is not None}
        if structured:  # as written: the gateway checks them (the same 400s as HTTP's)
            req.structured_fields = json.dumps(structured, ensure_ascii=False)
        env = pb.Envelope(batch=pb.Batch(requests=[req]))
        # encode_trusted packs a list of ids with `array` (a numpy conversion per request cost
        # half of building it); ids outside int32 or an oversized message still raise ValueError
        return rid, codec.encode_trusted(env, arrays)

    def _assembler(self, prompt: str | list[int], sampling: dict) -> OutputAssembler:
        """The same output assembly as the gateway's (stop strings, min_tokens, special
        tokens, the stop token left out of the text)."""
        stop = sampling.get("stop")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        context = [] if isinstance(prompt, str) else list(prompt)
        bundle = self.bundle
        skip = sampling.get("skip_special_tokens", True)
        decode = bundle.decode if skip else partial(bundle.decode, skip_special_tokens=False)
        eos = () if sampling.get("ignore_eos") else bundle.eos_token_ids
        return OutputAssembler(decode, context, stops,
                               sampling.get("include_stop_str_in_output", False),
                               sampling.get("min_tokens", 0),
                               (*eos, *(sampling.get("stop_token_ids") or ())))

    def _echo(self, prompt: str | list[int], sampling: dict) -> Delta | None:
        """With echo: the prompt's text as a first delta (as HTTP's echo does)."""
        if not sampling.get("echo"):
            return None
        text = prompt if isinstance(prompt, str) else self.bundle.decode(list(prompt))
        return Delta(text, [], None)

    def _apply(self, asm: OutputAssembler, decoded: codec.Decoded,
               out: pb.RequestOutput) -> Delta:
        arr = codec.array_of(decoded, out.tokens_frame)
        ids = arr.tolist() if arr is not None else []
        lps = [(lp.logprob, list(lp.top_ids), list(lp.top_logprobs)) for lp in out.logprobs]
        d = asm.add(ids, time.monotonic(), FINISH_REASON_FROM_WIRE.get(out.finish_reason),
                    lps or None)
        logprobs = None
        if d.logprobs is not None:
            decode = self.bundle.decode
            logprobs = [TokenLogprob(t, decode([t]), lp, [TopLogprob(i, decode([i]), v)
                                                          for i, v in zip(top_ids, top_lps)])
                        for t, (lp, top_ids, top_lps) in zip(d.token_ids, d.logprobs)]
        return Delta(d.text, d.token_ids, d.finish_reason, out.request_id, out.num_prompt_tokens,
                     logprobs, out.num_draft_tokens, out.num_accepted_draft_tokens,
                     out.num_accepted_prediction_tokens, out.num_rejected_prediction_tokens,
                     out.num_cached_tokens, out.pin_status)

    def _completion(self, prompt: str | list[int], sampling: dict,
                    deltas: list[Delta]) -> Completion:
        ids = [t for d in deltas for t in d.token_ids]
        finish = next((d.finish_reason for d in reversed(deltas) if d.finish_reason), "stop")
        text = "".join(d.text for d in deltas)
        logprobs = offsets = None
        if sampling.get("logprobs") is not None:
            logprobs = [lp for d in deltas for lp in (d.logprobs or [])]
            echo = deltas[0].text if sampling.get("echo") and deltas else ""
            offsets, pos = [], len(echo)
            for lp in logprobs:
                offsets.append(pos)
                pos += len(lp.token)
        if isinstance(prompt, str):
            prompt_ids = None if sampling.get("suffix") else self.bundle.encode(prompt)
        else:
            prompt_ids = list(prompt)
        def last(name: str) -> int:  # the counters are cumulative
            return max((getattr(d, name) for d in deltas), default=0)

        def final(name: str) -> int:  # the prediction's usage: the finishing record's (the
            # engine's exact count; its running count while decoding may be above it)
            return next((getattr(d, name) for d in reversed(deltas) if d.finish_reason),
                        last(name))

        return Completion(next((d.request_id for d in deltas if d.request_id), ""), text, ids,
                          finish, max((d.num_prompt_tokens for d in deltas), default=0),
                          len(ids), logprobs, offsets, prompt_ids, last("num_draft_tokens"),
                          last("num_accepted_draft_tokens"), final("accepted_prediction_tokens"),
                          final("rejected_prediction_tokens"), last("num_cached_tokens"),
                          {1: "pinned", 2: "over_budget", 3: "unsupported"}.get(
                              last("pin_status")))


# --- asyncio ---------------------------------------------------------------------------------------
class AsyncClient(_Base):
    def __init__(self, address: str, *, timeout: float = 60.0, connect_timeout: float = 10.0,
                 curve_key: str | None = None, server_key: str | None = None,
                 api_key: str | None = None):
        super().__init__(address, timeout, connect_timeout, curve_key, server_key, api_key)
        self._ctx = zmq.asyncio.Context()
        self._sock = self._socket(self._ctx)
        self._queues: dict[str, asyncio.Queue] = {}
        self._info_waiter: asyncio.Future | None = None
        self._reader: asyncio.Task | None = None

    async def connect(self) -> AsyncClient:
        """Say Hello and wait for the gateway's BackendInfo (model, limits, tokenizer)."""
        if self._reader is None:
            self._reader = asyncio.create_task(self._read_loop())
        self._info_waiter = asyncio.get_running_loop().create_future()
        await self._sock.send_multipart(self._hello())
        try:
            info = await asyncio.wait_for(self._info_waiter, self.connect_timeout)
        except asyncio.TimeoutError:
            raise RequestTimeout(f"no answer from {self.address} within "
                                 f"{self.connect_timeout:g} s") from None
        self._set_info(info)
        return self

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._sock.close(linger=0)
        self._ctx.destroy(linger=0)

    async def __aenter__(self) -> Self:
        try:
            return await self.connect()
        except BaseException:
            await self.close()  # no __aexit__ after a failed __aenter__: do not leak the socket
            raise

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _read_loop(self) -> None:
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            try:
                decoded = codec.decode(frames)
            except codec.DecodeError:
                continue
            env = decoded.envelope
            if decoded.kind == "backend_info":
                if self._info_waiter is not None and not self._info_waiter.done():
                    self._info_waiter.set_result(env.backend_info)
            elif decoded.kind == "step_output":
                for out in env.step_output.outputs:
                    q = self._queues.get(out.request_id)
                    if q is not None:
                        q.put_nowait((decoded, out))
            elif decoded.kind == "error":
                q = self._queues.get(env.error.request_id)
                if q is not None:
                    q.put_nowait(error_from_wire(env.error))
                elif self._info_waiter is not None and not self._info_waiter.done():
                    self._info_waiter.set_exception(error_from_wire(env.error))

    async def stream(self, prompt: str | list[int], **sampling) -> AsyncIterator[Delta]:
        """Deltas as they come; closing the iterator early aborts the request."""
        if self.bundle is None:
            await self.connect()
        rid, frames = self._request(prompt, sampling)
        asm = self._assembler(prompt, sampling)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = q
        # A timer posts the timeout (asyncio.wait_for per item could swallow a cancellation).
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.timeout, q.put_nowait, RequestTimeout(
            f"request {rid} timed out after {self.timeout:g} s", "TIMEOUT", rid))
        try:
            await self._sock.send_multipart(frames)
            echo = self._echo(prompt, sampling)
            if echo is not None:
                echo.request_id = rid
                yield echo
            reauthenticated = False
            while not asm.finished:
                item = await q.get()
                if isinstance(item, AuthenticationError) and self._api_key and \
                        not reauthenticated:
                    # A restarted gateway has not seen our Hello on this connection yet: say it
                    # again, then the request (one connection keeps the order), once.
                    reauthenticated = True
                    await self._sock.send_multipart(self._hello())
                    await self._sock.send_multipart(frames)
                    continue
                if isinstance(item, TidegateError):
                    raise item
                delta = self._apply(asm, *item)
                if delta.text or delta.token_ids or delta.finish_reason:
                    yield delta
        finally:
            timer.cancel()
            self._queues.pop(rid, None)
            if not asm.finished or asm.stopped_by_string:
                await self._sock.send_multipart(codec.encode(codec.make_abort([rid])))

    async def generate(self, prompt: str | list[int], **sampling) -> Completion:
        return self._completion(prompt, sampling,
                                [d async for d in self.stream(prompt, **sampling)])


# --- blocking ---------------------------------------------------------------------------------------
class Client(_Base):
    def __init__(self, address: str, *, timeout: float = 60.0, connect_timeout: float = 10.0,
                 curve_key: str | None = None, server_key: str | None = None,
                 api_key: str | None = None):
        super().__init__(address, timeout, connect_timeout, curve_key, server_key, api_key)
        self._ctx = zmq.Context()
        self._sock = self._socket(self._ctx)
        # one poller for the client's life (Socket.poll builds and registers one per call)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        try:
            self.connect()
        except BaseException:
            self.close()
            raise

    def connect(self) -> Client:
        self._sock.send_multipart(self._hello())
        deadline = time.monotonic() + self.connect_timeout
        while True:
            decoded = self._recv(deadline, f"no answer from {self.address} within "
                                           f"{self.connect_timeout:g} s")
            if decoded.kind == "backend_info":
                self._set_info(decoded.envelope.backend_info)
                return self
            if decoded.kind == "error" and not decoded.envelope.error.request_id:
                raise error_from_wire(decoded.envelope.error)

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _recv(self, deadline: float, what: str, rid: str = "") -> codec.Decoded:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._poller.poll(int(remaining * 1000) + 1):
                if time.monotonic() >= deadline:
                    raise RequestTimeout(what, "TIMEOUT", rid)
                continue
            try:
                return codec.decode(self._sock.recv_multipart(copy=False))
            except codec.DecodeError:
                continue

    def stream(self, prompt: str | list[int], **sampling) -> Iterator[Delta]:
        """Deltas as they come; closing the generator early (break, close()) aborts it."""
        rid, frames = self._request(prompt, sampling)
        asm = self._assembler(prompt, sampling)
        deadline = time.monotonic() + self.timeout
        self._sock.send_multipart(frames)
        reauthenticated = False
        try:
            echo = self._echo(prompt, sampling)
            if echo is not None:
                echo.request_id = rid
                yield echo
            while not asm.finished:
                decoded = self._recv(deadline, f"request {rid} timed out after "
                                               f"{self.timeout:g} s", rid)
                env = decoded.envelope
                if decoded.kind == "error" and env.error.request_id == rid:
                    if env.error.code == pb.Error.UNAUTHENTICATED and self._api_key and \
                            not reauthenticated:  # a restarted gateway: Hello again, once
                        reauthenticated = True
                        self._sock.send_multipart(self._hello())
                        self._sock.send_multipart(frames)
                        continue
                    raise error_from_wire(env.error)
                if decoded.kind != "step_output":
                    continue
                for out in env.step_output.outputs:
                    if out.request_id == rid:
                        delta = self._apply(asm, decoded, out)
                        if delta.text or delta.token_ids or delta.finish_reason:
                            yield delta
        finally:
            if not asm.finished or asm.stopped_by_string:
                self._sock.send_multipart(codec.encode(codec.make_abort([rid])))

    def generate(self, prompt: str | list[int], **sampling) -> Completion:
        return self._completion(prompt, sampling, list(self.stream(prompt, **sampling)))
