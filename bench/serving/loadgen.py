"""Open-loop load generator against an OpenAI-compatible `/v1/completions` (ours or vLLM's).

Requests leave on the schedule's clock whatever the server does (open loop); `max_concurrency`
holds a request back until one of the in-flight ones finishes, and its send time is taken when it
really leaves (vLLM's convention: TTFT then excludes the client-side wait). With rate inf and a
concurrency cap this is a closed loop of that many users.

Every request is streamed: `prompt` is a list of token ids (exact input length), `ignore_eos`
makes the output length exactly max_tokens, `stream_options.include_usage` asks for the final
usage, and `return_token_ids` asks for the ids of each chunk. Tokens per chunk:

  * a choice with `token_ids`         -> len(token_ids) (an empty list carries no token);
  * a choice with only `prompt_token_ids` (the prompt-echo chunk vLLM and we send first
    with return_token_ids)            -> 0: not a token arrival, never the first token;
  * any other choice (a server that ignores return_token_ids) -> 1, vLLM's convention.
The request's output token count is usage.completion_tokens when the server sends it, else the sum.
Each SSE line is timestamped when the client reads it.

Failures are recorded, never raised: http_<status> (with the server's error message), stream_error
(a `data: {"error": ...}` event), incomplete (no `[DONE]`), timeout, connection.
"""
from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass

import aiohttp

from sims.metrics import RequestRecord


@dataclass(frozen=True)
class HttpTarget:
    url: str = "http://127.0.0.1:8000"
    endpoint: str = "/v1/completions"
    model: str | None = None              # None: the first id from GET /v1/models
    api_key: str | None = None
    timeout_s: float = 600.0
    return_token_ids: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    speculation: object = None  # the requests' `speculation` field (issue 28); None: absent


def request_body(target: HttpTarget, model: str, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": int(max_tokens),
            "temperature": target.temperature, "stream": True, "ignore_eos": target.ignore_eos,
            "stream_options": {"include_usage": True}}
    if target.return_token_ids:
        body["return_token_ids"] = True
    if target.speculation is not None:
        body["speculation"] = target.speculation
    return body


def chunk_tokens(choice: dict) -> int:
    """Tokens one streamed choice carries (see the module docstring)."""
    ids = choice.get("token_ids")
    if ids is not None:
        return len(ids)
    if "prompt_token_ids" in choice:
        return 0
    return 1


def _headers(target: HttpTarget) -> dict:
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}


async def resolve_model(session: aiohttp.ClientSession, target: HttpTarget) -> str:
    if target.model:
        return target.model
    async with session.get(target.url.rstrip("/") + "/v1/models", headers=_headers(target)) as r:
        r.raise_for_status()
        data = (await r.json())["data"]
    if not data:
        raise RuntimeError(f"{target.url}/v1/models lists no model; pass --model")
    return data[0]["id"]


def _error_message(raw: bytes) -> str:
    try:
        err = json.loads(raw)["error"]
        return str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except (ValueError, KeyError, TypeError):
        return raw[:200].decode(errors="replace")


async def _sse_lines(resp: aiohttp.ClientResponse):
    """(read time, line) for each line of the body; no line-length limit, unlike readline."""
    buf = b""
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield now, line
    if buf:
        yield time.perf_counter(), buf


async def _read_stream(resp: aiohttp.ClientResponse, rec: RequestRecord) -> None:
    usage_tokens = None
    done = False
    async for now, raw in _sse_lines(resp):
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            break
        data = json.loads(payload)
        if not isinstance(data, dict):
            rec.error, rec.error_detail = "bad_response", "an SSE event that is not a JSON object"
            return
        if "error" in data:
            rec.error, rec.error_detail = "stream_error", _error_message(payload)
            return
        k = sum(chunk_tokens(c) for c in data.get("choices") or ())
        if k > 0:
            rec.chunk_times.append(now)
            rec.chunk_tokens.append(k)
        usage = data.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            usage_tokens = int(usage["completion_tokens"])
    if not done:
        rec.error = "incomplete"
        rec.error_detail = "the stream ended without [DONE]"
        return
    rec.output_tokens = usage_tokens if usage_tokens is not None else sum(rec.chunk_tokens)
    if not rec.chunk_times:
        rec.error, rec.error_detail = "no_tokens", "the stream carried no token"


async def send_http(session: aiohttp.ClientSession, target: HttpTarget, url: str, body: bytes,
                    rec: RequestRecord) -> None:
    """Send one streamed completion and fill `rec`; never raises (except cancellation)."""
    rec.send_time = time.perf_counter()
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json",
                                                         **_headers(target)}) as resp:
            if resp.status != 200:
                rec.error = f"http_{resp.status}"
                rec.error_detail = _error_message(await resp.read())
                rec.retry_after_s = retry_after(resp.headers)
                return
            await _read_stream(resp, rec)
    except asyncio.TimeoutError:
        rec.error, rec.error_detail = "timeout", f"no answer within {target.timeout_s} s"
    except (aiohttp.ClientError, ValueError) as exc:
        rec.error = "connection" if isinstance(exc, aiohttp.ClientError) else "bad_response"
        rec.error_detail = f"{exc.__class__.__name__}: {exc}"


def retry_after(headers) -> float:
    """A refusal's wait in seconds: retry-after-ms (ms, as the OpenAI SDK reads it), else
    Retry-After (whole seconds); NaN when neither is there or readable."""
    for name, scale in (("retry-after-ms", 1e-3), ("Retry-After", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) * scale
            except ValueError:
                continue
    return math.nan


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, enabled: bool, stream=sys.stderr):
        self.total, self.enabled, self.stream = total, enabled, stream
        self.done = self.failed = 0
        self.t0 = time.perf_counter()

    def update(self, rec: RequestRecord) -> None:
        self.done += 1
        self.failed += not rec.ok
        if self.enabled and (self.done == self.total or self.done % max(1, self.total // 100) == 0):
            width = 30
            fill = int(width * self.done / self.total)
            el = time.perf_counter() - self.t0
            self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                              f"{self.failed} failed {el:6.1f} s")
            if self.done == self.total:
                self.stream.write("\n")
            self.stream.flush()


async def run_schedule(offsets, send_one, records: list[RequestRecord],
                       max_concurrency: int | None = None, progress: Progress | None = None) -> float:
    """Start `send_one(i)` at t0 + offsets[i] (under the concurrency cap); returns t0."""
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(i: int) -> None:
        if sem is None:
            await send_one(i)
        else:
            async with sem:
                await send_one(i)
        if progress is not None:
            progress.update(records[i])

    t0 = time.perf_counter()
    tasks = []
    for i, off in enumerate(offsets):
        delay = t0 + float(off) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return t0


async def run_http(target: HttpTarget, offsets, prompts: list[list[int]], output_lens,
                   max_concurrency: int | None = None, progress: bool = False
                   ) -> tuple[list[RequestRecord], float, str]:
    """Run the whole schedule against `target`; returns (records, start time, model name)."""
    n = len(prompts)
    limit = max_concurrency or 0
    connector = aiohttp.TCPConnector(limit=limit, force_close=False)
    timeout = aiohttp.ClientTimeout(total=target.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model = await resolve_model(session, target)
        bodies = [json.dumps(request_body(target, model, prompts[i], int(output_lens[i])),
                             separators=(",", ":")).encode() for i in range(n)]
        records = [RequestRecord(i, len(prompts[i]), int(output_lens[i])) for i in range(n)]
        url = target.url.rstrip("/") + target.endpoint

        async def send_one(i: int) -> None:
            await send_http(session, target, url, bodies[i], records[i])

        bar = Progress(n, progress)
        t0 = await run_schedule(offsets, send_one, records, max_concurrency, bar)
    return records, t0, model


# --- ZMQ: the same schedule through gateway.client.AsyncClient --------------------------------------
async def send_zmq(client, prompt: list[int], max_tokens: int, rec: RequestRecord,
                   ignore_eos: bool = True, temperature: float = 0.0,
                   speculation=None) -> None:
    """One streamed request through the client library; a delta with k token ids is one chunk of
    k tokens. Errors: timeout, or zmq_<code> with the server's error code (zmq_capacity, ...)."""
    from gateway.client import TidegateError

    rec.send_time = time.perf_counter()
    try:
        extra = {} if speculation is None else {"speculation": speculation}
        async for d in client.stream(prompt, max_tokens=max_tokens, temperature=temperature,
                                     ignore_eos=ignore_eos, **extra):
            if d.token_ids:
                rec.chunk_times.append(time.perf_counter())
                rec.chunk_tokens.append(len(d.token_ids))
    except TimeoutError as exc:
        rec.error, rec.error_detail = "timeout", str(exc)
        return
    except TidegateError as exc:
        rec.error, rec.error_detail = f"zmq_{exc.code.lower()}", str(exc)
        return
    rec.output_tokens = sum(rec.chunk_tokens)
    if not rec.chunk_times:
        rec.error, rec.error_detail = "no_tokens", "the stream carried no token"


async def run_zmq(address: str, offsets, prompts: list[list[int]], output_lens,
                  max_concurrency: int | None = None, progress: bool = False,
                  timeout_s: float = 600.0, ignore_eos: bool = True, temperature: float = 0.0,
                  speculation=None) -> tuple[list[RequestRecord], float, str]:
    """Run the schedule against a gateway's ZMQ front door (`tidegate serve --zmq-listen`)."""
    from gateway.client import AsyncClient

    n = len(prompts)
    records = [RequestRecord(i, len(prompts[i]), int(output_lens[i])) for i in range(n)]
    # connect() and close() by hand: `async with` would leave the socket open (and the ZMQ
    # context's teardown blocked) when the gateway never answers the Hello
    client = AsyncClient(address, timeout=timeout_s, connect_timeout=min(10.0, timeout_s))
    try:
        await client.connect()

        async def send_one(i: int) -> None:
            await send_zmq(client, prompts[i], int(output_lens[i]), records[i], ignore_eos,
                           temperature, speculation)

        t0 = await run_schedule(offsets, send_one, records, max_concurrency, Progress(n, progress))
        model = client.model
    finally:
        await client.close()
    return records, t0, model
