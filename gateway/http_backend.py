"""An OpenAI-compatible HTTP server as one of the pool's backends: `tidegate serve --backend
http://host:port` (`vllm serve`, SGLang, another tidegate — anything with streamed
`/v1/completions` that can return token ids).

It stands where a ZMQ connection stands (`gateway.backend_pool.BackendConn`) and speaks to the
pool in our own messages, so the queues, the window, placement, the gap checks and the error
model are the same in front of it:

    pool → send(Hello)   GET /v1/models (+ /health)   → BackendInfo (model, max_model_len; the
                                                        tokenizer from `tokenizer`, see below)
    pool → send(Batch)   one streamed POST /v1/completions per request, token-id prompt,
                         return_token_ids → one StepOutput per chunk (its delta token ids)
    pool → send(Abort)   the stream is closed (the server aborts a request whose client left)
    every `poll_s`       GET /health (and /metrics when it is vLLM's) → LoadReport

An HTTP server does not hand out its tokenizer, so the BackendInfo carries the one the pool was
given (`tokenizer`: a `TokenizerBundle` from `--tokenizer DIR`), and the gateway tokenizes and
detokenizes as in front of our own backends. Without one, the server does both: the gateway
tokenizes prompts through its /tokenize (`gateway.remote_tokenizer`) and each StepOutput carries
the chunk's text (`RequestOutput.text`), made with the request's `skip_special_tokens`. Either
way the server receives token ids only.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterable

import aiohttp

from gateway.structured import structured_outputs_field
from proto import codec
from proto import tidegate_pb2 as pb

log = logging.getLogger("tidegate.gateway.http")

FINISH = {"stop": pb.RequestOutput.STOP, "length": pb.RequestOutput.LENGTH,
          "abort": pb.RequestOutput.ABORT}
_VLLM_GAUGES = {"vllm:num_requests_running": "num_running",
                "vllm:num_requests_waiting": "num_waiting",
                "vllm:kv_cache_usage_perc": "kv_usage"}
_KV_TOKENS = re.compile(r'^vllm:cache_config_info\{[^}]*\bkv_cache_size_tokens="(\d+)"', re.MULTILINE)
_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$")
REPORT_BLOCKS = 1000  # a LoadReport's KV figures are usage * this many (the server hides its blocks)


class _HttpIO:
    """What the pool reads through `BackendConn.io`: the message handler, start and stop."""

    def __init__(self, conn: HttpBackendConn) -> None:
        self.conn = conn
        self._on_message: Callable[[list], None] = lambda frames: None

    def start(self) -> None:
        self.conn.start()

    def stop(self) -> None:
        self.conn.stop()

    def check(self) -> None:
        pass


class HttpBackendConn:
    """One OpenAI-compatible server, with the attributes the pool reads from a `BackendConn`."""

    sock = None  # no ZMQ socket: the pool skips socket-level watching for this backend

    def __init__(self, address: str, tokenizer=None, poll_s: float = 1.0,
                 model: str | None = None) -> None:
        self.address = address.rstrip("/")
        self.tokenizer = tokenizer          # TokenizerBundle for BackendInfo, or None
        self.poll_s = poll_s
        self.model = model                  # the served model's name; default: the server's first
        self.io = _HttpIO(self)
        self.info: pb.BackendInfo | None = None
        self.load = pb.LoadReport()
        self.healthy = False
        self.last_seen = 0.0
        self.last_hello = 0.0
        self.inflight: dict = {}
        self.pid = -1
        self.placement = None
        self.draining = False
        self.kv_capacity_tokens = 0  # from vLLM's cache_config_info (placement's slack); 0: unknown
        self._session: aiohttp.ClientSession | None = None
        self._streams: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._poller: asyncio.Task | None = None

    # ---- what the pool reads ---------------------------------------------------------------
    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The connection pool to the server (None until started); the remote tokenizer's too."""
        return self._session

    @property
    def num_inflight(self) -> int:
        return len(self.inflight)

    @property
    def kv_cache_usage(self) -> float:
        total = self.load.num_total_blocks
        return 1.0 - self.load.num_free_blocks / total if total else 0.0

    @property
    def outstanding_tokens(self) -> int:
        return self.placement.load(self.pid) if self.placement is not None else 0

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None,
                                                                            sock_connect=5))
        self._poller = asyncio.create_task(self._poll(), name=f"http-backend {self.address}")

    def stop(self) -> None:
        for t in [*self._streams.values(), *self._tasks, *([self._poller] if self._poller else [])]:
            t.cancel()
        self._streams.clear()
        if self._session is not None:
            session, self._session = self._session, None
            asyncio.get_event_loop().create_task(session.close())

    def _emit(self, envelope: pb.Envelope, arrays: Iterable = ()) -> None:
        """Hand one of our messages to the pool's reader, as if it had come over a socket."""
        self.io._on_message(codec.encode(envelope, list(arrays)))

    def _spawn(self, coro) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ---- the pool's messages -----------------------------------------------------------------
    def send(self, envelope: pb.Envelope, arrays: Iterable = ()) -> bool:
        if self._session is None:
            return False
        kind = envelope.WhichOneof("body")
        if kind == "hello":
            self._spawn(self._introduce())
        elif kind == "batch":
            arrays = list(arrays)
            for req in envelope.batch.requests:
                prompt = list(arrays[req.prompt_frame]) if 0 <= req.prompt_frame < len(arrays) else []
                t = asyncio.get_running_loop().create_task(self._stream(req, prompt))
                self._streams[req.request_id] = t
                t.add_done_callback(lambda _t, rid=req.request_id: self._streams.pop(rid, None))
        elif kind == "abort":
            for rid in envelope.abort.request_ids:
                t = self._streams.pop(rid, None)
                if t is not None:
                    t.cancel()  # closing the stream is how an HTTP client aborts
        elif kind == "health" and not envelope.health.reply:
            self._spawn(self._pong(envelope.health.nonce))
        return True

    async def _introduce(self) -> None:
        try:
            async with self._session.get(f"{self.address}/v1/models") as resp:
                models = (await resp.json()).get("data") or []
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            log.debug("%s: no model list yet: %s", self.address, exc)
            return
        if not models:
            return
        m = next((x for x in models if x.get("id") == self.model), models[0])
        info = pb.BackendInfo(protocol_version=codec.PROTOCOL_VERSION, model=str(m.get("id", "")),
                              max_model_len=int(m.get("max_model_len") or 0), block_size=16,
                              backend_id=self.address)
        tok = self.tokenizer
        if tok is not None:
            info.tokenizer_json = tok.tokenizer_json
            info.chat_template = tok.chat_template or ""
            info.eos_token_ids.extend(tok.eos_token_ids)
            if tok.bos_token_id is not None:
                info.bos_token_id = tok.bos_token_id
        self._emit(pb.Envelope(backend_info=info))

    async def _pong(self, nonce: int) -> None:
        if await self._healthy():
            self._emit(codec.make_health(nonce, 0.0, reply=True))

    async def _healthy(self) -> bool:
        try:
            async with self._session.get(f"{self.address}/health") as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    # ---- load ----------------------------------------------------------------------------------
    async def _poll(self) -> None:
        """/health keeps the backend alive in the pool's eyes (a LoadReport each period);
        vLLM's /metrics gauges, when there, fill it."""
        while True:
            await asyncio.sleep(self.poll_s)
            if self.info is None or not await self._healthy():
                continue
            report = pb.LoadReport(backend_id=self.address)
            gauges = await self._metrics()
            self.kv_capacity_tokens = int(gauges.pop("kv_tokens", 0))
            if gauges:
                report.num_running = int(gauges.get("num_running", 0))
                report.num_waiting = int(gauges.get("num_waiting", 0))
                usage = min(1.0, max(0.0, gauges.get("kv_usage", 0.0)))
                report.num_total_blocks = REPORT_BLOCKS
                report.num_free_blocks = round((1.0 - usage) * REPORT_BLOCKS)
            else:
                report.num_running = len(self.inflight)
            self._emit(pb.Envelope(load_report=report))

    async def _metrics(self) -> dict[str, float]:
        try:
            async with self._session.get(f"{self.address}/metrics") as resp:
                if resp.status != 200:
                    return {}
                text = await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return {}
        return parse_vllm_gauges(text)

    # ---- one request ---------------------------------------------------------------------------
    async def _stream(self, req: pb.GenerateRequest, prompt: list[int]) -> None:
        rid = req.request_id
        passes_text = self.tokenizer is None  # the gateway cannot detokenize: the server does
        body = completion_body(self.info.model if self.info else "", prompt, req.sampling,
                               passes_text)
        generated = 0
        try:
            async with self._session.post(f"{self.address}/v1/completions", json=body) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    code = (pb.Error.INVALID_REQUEST if 400 <= resp.status < 500 and resp.status != 429
                            else pb.Error.CAPACITY if resp.status in (429, 503) else pb.Error.INTERNAL)
                    self._emit(codec.make_error(code, f"HTTP {resp.status}: {text}", rid))
                    return
                async for chunk in sse_json(resp.content):
                    if "error" in chunk:  # the server's error event (then its [DONE])
                        err = chunk["error"]
                        msg = err.get("message") if isinstance(err, dict) else err
                        self._emit(codec.make_error(pb.Error.INTERNAL,
                                                    f"the server failed: {str(msg)[:300]}", rid))
                        return
                    choice = (chunk.get("choices") or [{}])[0]
                    ids = choice.get("token_ids")
                    finish = choice.get("finish_reason")
                    if ids is None and not finish and choice.get("text"):
                        self._emit(codec.make_error(
                            pb.Error.INTERNAL, "the server streams no token ids "
                            "(it needs return_token_ids, as vLLM has)", rid))
                        return
                    ids = [int(t) for t in ids or []]
                    generated += len(ids)
                    out = pb.StepOutput()
                    out.outputs.add(request_id=rid, num_prompt_tokens=len(prompt),
                                    num_completion_tokens=generated,
                                    tokens_frame=0 if ids else codec.NO_FRAME,
                                    finish_reason=FINISH.get(finish, pb.RequestOutput.STOP)
                                    if finish else pb.RequestOutput.NONE,
                                    text=str(choice.get("text") or "") if passes_text else "")
                    self._emit(pb.Envelope(step_output=out), [ids] if ids else [])
                    if finish:
                        return
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            self._emit(codec.make_error(pb.Error.INTERNAL, f"{type(exc).__name__}: {exc}", rid))
            return
        self._emit(codec.make_error(pb.Error.INTERNAL, "the stream ended without a finish", rid))


def completion_body(model: str, prompt: list[int], s: pb.SamplingParams,
                    passes_text: bool = False) -> dict:
    """Our SamplingParams as a `/v1/completions` body (vLLM's extra fields where OpenAI has none).
    The text the server streams is used only when it `passes_text`: then it is made with the
    request's skip_special_tokens."""
    skip = passes_text and (not s.HasField("skip_special_tokens") or s.skip_special_tokens)
    body = {"model": model, "prompt": prompt, "max_tokens": s.max_tokens,
            "temperature": s.temperature, "stream": True, "return_token_ids": True,
            "skip_special_tokens": skip}
    if s.top_p > 0:
        body["top_p"] = s.top_p
    if s.top_k > 0:
        body["top_k"] = s.top_k
    if s.HasField("seed"):
        body["seed"] = s.seed
    if s.stop_token_ids:
        body["stop_token_ids"] = list(s.stop_token_ids)
    if s.ignore_eos:
        body["ignore_eos"] = True
    if s.HasField("grammar"):  # structured output: vLLM's field (the server enforces it)
        so = structured_outputs_field(s.grammar)
        if so is not None:
            body["structured_outputs"] = so
    return body


async def sse_json(content: aiohttp.StreamReader):
    """The JSON payloads of a `data: ...` server-sent event stream, up to `[DONE]`."""
    async for raw in content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


def parse_vllm_gauges(text: str) -> dict[str, float]:
    """vLLM's Prometheus gauges we read (summed over label sets: one per engine), and its KV
    cache size in tokens as ``kv_tokens`` (a label of `vllm:cache_config_info`) when given."""
    out: dict[str, float] = {}
    kv = _KV_TOKENS.findall(text)
    if kv:
        out["kv_tokens"] = float(sum(int(x) for x in kv))
    for line in text.splitlines():
        m = _METRIC_LINE.match(line)
        if m and m.group(1) in _VLLM_GAUGES:
            key = _VLLM_GAUGES[m.group(1)]
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out
