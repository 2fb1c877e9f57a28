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
`Client` is for one thread; `AsyncClient` for one event loop.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from gateway.output import OutputAssembler
from proto import codec
from proto import tidegate_pb2 as pb
from proto.convert import FINISH_REASON_FROM_WIRE
from proto.security import SecurityError, keys_from_args
from tokenizer.bundle import TokenizerBundle

if TYPE_CHECKING:  # typing.Self is 3.11+; annotations are never evaluated at run time here
    from typing_extensions import Self

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "ignore_eos",
                   "logprobs", "stop")


class TidegateError(Exception):
    """An error from the gateway (or the connection); `code` is the proto Error.Code name."""

    def __init__(self, message: str, code: str = "UNKNOWN", request_id: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


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
    return cls(err.message, pb.Error.Code.Name(err.code), err.request_id)


@dataclass(slots=True)
class Delta:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    request_id: str = ""
    num_prompt_tokens: int = 0


@dataclass(slots=True)
class Completion:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    num_prompt_tokens: int
    num_completion_tokens: int


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
        unknown = set(sampling) - set(SAMPLING_FIELDS)
        if unknown:
            raise TypeError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        rid = f"{self._prefix}-{next(self._ids)}"
        sp = pb.SamplingParams(max_tokens=sampling.get("max_tokens", 16),
                               temperature=sampling.get("temperature", 1.0),
                               top_p=sampling.get("top_p", 1.0), top_k=sampling.get("top_k", 0),
                               ignore_eos=sampling.get("ignore_eos", False),
                               logprobs=sampling.get("logprobs") or 0)
        if sampling.get("seed") is not None:
            sp.seed = sampling["seed"]
        stop = sampling.get("stop") or []
        sp.stop.extend([stop] if isinstance(stop, str) else stop)
        req = pb.GenerateRequest(request_id=rid, sampling=sp, prompt_frame=codec.NO_FRAME)
        arrays = []
        if isinstance(prompt, str):
            req.prompt_text = prompt
        else:
            req.prompt_frame = 0
            arrays.append(list(prompt))
        env = pb.Envelope(batch=pb.Batch(requests=[req]))
        return rid, codec.encode(env, arrays)

    def _assembler(self, prompt: str | list[int], stop) -> OutputAssembler:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        context = [] if isinstance(prompt, str) else list(prompt)
        return OutputAssembler(self.bundle.decode, context, stops)

    @staticmethod
    def _apply(asm: OutputAssembler, decoded: codec.Decoded, out: pb.RequestOutput) -> Delta:
        arr = codec.array_of(decoded, out.tokens_frame)
        ids = arr.tolist() if arr is not None else []
        d = asm.add(ids, time.monotonic(), FINISH_REASON_FROM_WIRE.get(out.finish_reason))
        return Delta(d.text, d.token_ids, d.finish_reason, out.request_id, out.num_prompt_tokens)

    @staticmethod
    def _completion(deltas: list[Delta]) -> Completion:
        ids = [t for d in deltas for t in d.token_ids]
        finish = next((d.finish_reason for d in reversed(deltas) if d.finish_reason), "stop")
        return Completion(deltas[-1].request_id if deltas else "", "".join(d.text for d in deltas),
                          ids, finish, max((d.num_prompt_tokens for d in deltas), default=0),
                          len(ids))


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
        asm = self._assembler(prompt, sampling.get("stop"))
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = q
        # A timer posts the timeout (asyncio.wait_for per item could swallow a cancellation).
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.timeout, q.put_nowait, RequestTimeout(
            f"request {rid} timed out after {self.timeout:g} s", "TIMEOUT", rid))
        try:
            await self._sock.send_multipart(frames)
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
        return self._completion([d async for d in self.stream(prompt, **sampling)])


# --- blocking ---------------------------------------------------------------------------------------
class Client(_Base):
    def __init__(self, address: str, *, timeout: float = 60.0, connect_timeout: float = 10.0,
                 curve_key: str | None = None, server_key: str | None = None,
                 api_key: str | None = None):
        super().__init__(address, timeout, connect_timeout, curve_key, server_key, api_key)
        self._ctx = zmq.Context()
        self._sock = self._socket(self._ctx)
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
            if remaining <= 0 or not self._sock.poll(int(remaining * 1000) + 1):
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
        asm = self._assembler(prompt, sampling.get("stop"))
        deadline = time.monotonic() + self.timeout
        self._sock.send_multipart(frames)
        reauthenticated = False
        try:
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
        return self._completion(list(self.stream(prompt, **sampling)))
