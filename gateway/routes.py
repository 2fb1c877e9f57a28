"""POST /v1/completions and /v1/chat/completions: validate → tokenize → submit → respond.

Non-streaming answers wait for every sequence; streaming answers are SSE (`data: {...}` per
chunk, `data: [DONE]` at the end; a failure after the first byte becomes a
`data: {"error": ...}` event, followed by `data: [DONE]` as vLLM sends it). Whatever way a
handler ends — finished, failed, client gone — its handles are closed, which aborts any
sequence still running on a backend.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from aiohttp import web

from gateway.app_keys import ACTIVE_KEY, GATEWAY_KEY, QUEUE_CLASS_KEY
from gateway.chat_render import chat_prompt_ids
from gateway.core import Gateway, RequestHandle
from gateway.errors import APIError, bad_request, internal_error, not_found
from gateway.generation_defaults import apply_generation_defaults
from gateway.openai_schema import ChatRequest, CompletionRequest, Prompt, SamplingParams
from gateway.output import OutputDelta
from gateway.responses import (
    DONE,
    chat_body,
    chat_logprobs,
    completion_body,
    completion_choice,
    completion_logprobs,
    sse,
    usage,
)
from gateway.sessions import openai_options
from gateway.structured import check_structured
from gateway.tool_parser import StreamShaper, sampling_for_parser, shape_choice
from gateway.tools import template_messages, with_parser
from gateway.validation import (
    check_context_length,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)

log = logging.getLogger("tidegate.gateway.requests")


def check_model(gw: Gateway, model: str | None) -> None:
    if model is not None and model != gw.model_name and model != gw.info.model:
        raise not_found(f"The model '{model}' does not exist; this server serves "
                        f"'{gw.model_name}'.", "model", "model_not_found")


async def tokenize(gw: Gateway, prompt: Prompt, add_special_tokens: bool = True) -> list[int]:
    if isinstance(prompt, str):
        return await gw.encode(prompt, add_special_tokens)
    vocab = gw.info.vocab_size
    if vocab and max(prompt) >= vocab:
        raise bad_request(f"Token id {max(prompt)} in 'prompt' is out of range (vocabulary "
                          f"size {vocab}).", "prompt")
    return list(prompt)


def submit_all(gw: Gateway, base_id: str, prompts: list[list[int]], sampling: SamplingParams,
               options, max_tokens_param: str,
               prediction_ids: list[int] | None = None) -> list[RequestHandle]:
    """One handle per (prompt, choice), prompt-major: choice index = prompt * n + j. With a
    seed, choice j samples with seed + j (the n choices differ, reproducibly). Choices 1..n-1
    follow choice 0: queued when its first token arrives, so they find the prompt's full KV
    blocks in the prefix cache instead of prefilling them again."""
    max_len = gw.info.max_model_len
    gw.check_token_params(sampling)
    for ids in prompts:
        check_context_length(len(ids), sampling.max_tokens, max_len, max_tokens_param)
    n = sampling.n
    single = len(prompts) * n == 1
    handles: list[RequestHandle] = []
    try:
        for i, ids in enumerate(prompts):
            max_tokens = sampling.resolved_max_tokens(len(ids), max_len)
            leader = None
            for j in range(n):
                rid = base_id if single else f"{base_id}-{i * n + j}"
                s = sampling if j == 0 or sampling.seed is None else \
                    replace(sampling, seed=(sampling.seed + j) % (1 << 63))
                if leader is None:
                    leader = gw.submit(rid, ids, s, max_tokens, options, prediction_ids)
                    handles.append(leader)
                else:  # sent after the leader's prefill: its prompt blocks are cached then
                    handles.append(gw.submit_follower(leader, rid, ids, s, max_tokens, options,
                                                      prediction_ids))
    except APIError:
        for h in handles:
            h.close()
        raise
    return handles


def log_request(gw: Gateway, request_id: str, handles: list[RequestHandle], prompt) -> None:
    """One line per request: at DEBUG (`--log-level debug`), or at INFO with `--log-prompts`
    (an explicit opt-in to request logs). A default INFO line per request cost more than the
    rest of a 1-token request's path through the gateway."""
    if gw.config.log_prompts:
        h = handles[0]
        log.info("%s: %d prompt(s), %d prompt tokens, max_tokens=%d, class=%s, prompt=%r",
                 request_id, len(handles), sum(len(x.prompt_ids) for x in handles),
                 h.max_tokens, h.queue_class_name, prompt)
    elif log.isEnabledFor(logging.DEBUG):
        h = handles[0]
        log.debug("%s: %d prompt(s), %d prompt tokens, max_tokens=%d, class=%s", request_id,
                  len(handles), sum(len(x.prompt_ids) for x in handles), h.max_tokens,
                  h.queue_class_name)


async def merged(handles: list[RequestHandle], interval: int
                 ) -> AsyncIterator[tuple[int, OutputDelta]]:
    """Deltas of several sequences as they come, tagged with the sequence's index."""
    if len(handles) == 1:
        async for d in handles[0].deltas(interval):
            yield 0, d
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, h: RequestHandle) -> None:
        # Every pump ends with exactly one item that tells merged() it is done (None or an
        # error): one that died silently would leave merged() waiting forever.
        try:
            async for d in h.deltas(interval):
                queue.put_nowait((i, d))
        except APIError as err:
            queue.put_nowait((i, err))
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("output stream %d failed", i)
            queue.put_nowait((i, internal_error()))
            return
        queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(handles)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, APIError):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def serve_handles(request: web.Request, handles: list[RequestHandle], respond):
    """Run `respond` with the handles registered as active; close them and record metrics."""
    gw = request.app[GATEWAY_KEY]
    active = request.app[ACTIVE_KEY]
    request[QUEUE_CLASS_KEY] = handles[0].queue_class_name
    active.update(handles)
    status = 499  # client closed the connection, unless we learn otherwise
    try:
        result, status = await respond()
        return result
    except APIError as err:
        status = err.status
        raise
    finally:
        for h in handles:
            h.close()
            active.discard(h)
            gw.record(h, status)



async def start_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    return resp


class _Stalled(ConnectionResetError):
    """The client took no bytes for `stream_stall_timeout_s`."""


def _bounded(request: web.Request):
    """`io(*args)` (a write to the response), bounded in time: one that has to wait for the
    client (bytes still unsent in the transport) waits at most `stream_stall_timeout_s`, then the
    client counts as gone (`_Stalled`). With an empty buffer, the usual case, no timer is set."""
    transport = request.transport
    timeout_s = request.app[GATEWAY_KEY].config.stream_stall_timeout_s

    async def run(io, *args) -> None:
        if transport is None or not transport.get_write_buffer_size():
            await io(*args)
            return
        try:
            await asyncio.wait_for(io(*args), timeout_s)
        except asyncio.TimeoutError:
            raise _Stalled(f"the client took no bytes for {timeout_s:g} s") from None
    return run


def _drop_stalled(request: web.Request, exc: _Stalled) -> None:
    log.info("stream to %s stopped: %s", request.remote, exc)
    if request.transport is not None:
        request.transport.abort()  # what is buffered for it goes too


async def stream_events(request: web.Request, make_chunks, first_chunks, final_chunk):
    """SSE loop shared by both routes; returns (response, status for the metrics)."""
    resp = await start_sse(request)
    bounded = _bounded(request)

    async def write(data: bytes) -> None:
        await bounded(resp.write, data)

    try:
        for chunk in first_chunks:
            await write(sse(chunk))
        async for chunk in make_chunks():
            await write(sse(chunk))
        if final_chunk is not None:
            await write(sse(final_chunk()))
        await write(DONE)
        status = 200
    except APIError as err:  # the error event, then [DONE] as after any stream (vLLM's order)
        await write(sse(err.to_dict()))
        await write(DONE)
        status = err.status
    except _Stalled as exc:  # not reading: its handles get aborted, the connection is closed
        _drop_stalled(request, exc)
        return resp, 499
    except ConnectionResetError:  # the client went away mid-stream: its handles get aborted
        return resp, 499
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug must still end the stream in the OpenAI shape
        log.exception("stream failed")
        err = internal_error()
        await resp.write(sse(err.to_dict()) + DONE)
        status = err.status
    try:
        await bounded(resp.write_eof)
    except _Stalled as exc:  # everything was produced; the client did not take the tail
        _drop_stalled(request, exc)
    return resp, status


# --- /v1/completions ---------------------------------------------------------------------------
async def completions(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY_KEY]
    body = parse_json_body(await request.read())
    req: CompletionRequest = parse_completion_request(body, gw.config.limits)
    req = replace(req, sampling=apply_generation_defaults(body, req.sampling,
                                                          gw.generation_defaults),
                  options=openai_options(req.options, request.headers, body))
    gw.check_admission()
    check_model(gw, req.model)
    await check_structured(gw, req.structured)
    if req.suffix is not None:
        prompts = [gw.fim_prompt(p, req.suffix) for p in req.prompts]
    else:
        prompts = [await tokenize(gw, p, req.add_special_tokens) for p in req.prompts]
    internal_id = gw.new_request_id("cmpl")
    request_id = f"cmpl-{req.request_id}" if req.request_id else internal_id
    handles = submit_all(gw, internal_id, prompts, req.sampling, req.options, "max_tokens",
                         gw.tokenize_prediction(req.prediction))
    log_request(gw, request_id, handles, req.prompts)
    created, model = int(time.time()), gw.model_name
    n = req.sampling.n
    token_info = req.options.return_token_ids or req.sampling.logprobs is not None
    echo = [(p if isinstance(p, str) else await gw.decode_prompt(list(p))) if req.echo else None
            for p in req.prompts for _ in range(n)]

    async def respond():
        if not req.options.stream:
            async for _ in merged(handles, 1 << 30):
                pass
            choices = [completion_choice(i, h, echo[i]) for i, h in enumerate(handles)]
            return web.json_response(completion_body(request_id, created, model, choices,
                                                     handles, n)), 200
        offsets = [len(e or "") for e in echo]

        def chunk(choices, **extra):
            return {"id": request_id, "object": "text_completion", "created": created,
                    "model": model, "choices": choices, **extra}

        first = []
        for i, h in enumerate(handles):
            if echo[i] or req.options.return_token_ids:
                c = {"index": i, "text": echo[i] or "", "logprobs": None, "finish_reason": None}
                if req.options.return_token_ids:
                    c["prompt_token_ids"] = list(h.prompt_ids)
                first.append(chunk([c]))

        async def chunks():
            async for i, d in merged(handles, gw.config.stream_interval):
                if not (d.text or d.finish_reason or token_info):
                    continue  # only held-back bytes so far: nothing to show
                c = {"index": i, "text": d.text,
                     "logprobs": completion_logprobs(handles[i], d.token_ids, d.logprobs,
                                                     offsets[i]),
                     "finish_reason": d.finish_reason}
                offsets[i] += len(d.text)
                if req.options.return_token_ids:
                    c["token_ids"] = d.token_ids
                yield chunk([c])

        final = (lambda: chunk([], usage=usage(handles, n))) if req.options.include_usage \
            else None
        return await stream_events(request, chunks, first, final)

    return await serve_handles(request, handles, respond)


# --- /v1/chat/completions ----------------------------------------------------------------------
async def chat_completions(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY_KEY]
    body = parse_json_body(await request.read())
    req: ChatRequest = parse_chat_request(body, gw.config.limits)
    req = replace(req, sampling=apply_generation_defaults(body, req.sampling,
                                                          gw.generation_defaults),
                  options=openai_options(req.options, request.headers, body))
    gw.check_admission()
    check_model(gw, req.model)
    await check_structured(gw, req.structured)
    tools = with_parser(req.structured.tools if req.structured is not None else None,
                        gw.config.tool_call_parser, gw.info.chat_template)
    messages = template_messages(req.messages, tools)  # (the request log's view)
    prompt_ids = await chat_prompt_ids(gw, req.messages, tools, req.add_generation_prompt,
                                       req.add_special_tokens)
    internal_id = gw.new_request_id("chatcmpl")
    request_id = f"chatcmpl-{req.request_id}" if req.request_id else internal_id
    param = "max_tokens"
    handles = submit_all(gw, internal_id, [prompt_ids], sampling_for_parser(tools, req.sampling),
                         req.options, param,
                         gw.tokenize_prediction(req.prediction))
    log_request(gw, request_id, handles, messages)
    created, model = int(time.time()), gw.model_name
    token_info = req.options.return_token_ids or req.sampling.logprobs is not None
    # echo (vLLM's): the reply starts with the last message when it is the assistant's
    echo = req.messages[-1].content if req.echo and req.messages[-1].role == "assistant" else ""

    async def respond():
        if not req.options.stream:
            async for _ in merged(handles, 1 << 30):
                pass
            body = chat_body(request_id, created, model, handles, req.sampling.n, echo)
            if tools is not None and tools.active:
                for choice in body["choices"]:
                    shape_choice(choice, tools)
            return web.json_response(body), 200

        def chunk(choices, **extra):
            return {"id": request_id, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": choices, **extra}

        first = []
        for i, h in enumerate(handles):
            role = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None}
            if req.options.return_token_ids:
                role["prompt_token_ids"] = list(h.prompt_ids)
            first.append(chunk([role]))
            if echo:
                first.append(chunk([{"index": i, "delta": {"content": echo}, "logprobs": None,
                                     "finish_reason": None}]))

        shaper = StreamShaper(tools, len(handles)) if tools is not None and tools.active \
            else None

        async def chunks():
            async for i, d in merged(handles, gw.config.stream_interval):
                delta, finish = ({"content": d.text} if d.text else {}), d.finish_reason
                if shaper is not None:  # tool calls leave the content as whole calls
                    delta, finish = shaper.delta(i, d.text, d.finish_reason)
                if not (delta or finish or token_info):
                    continue
                c = {"index": i, "delta": delta,
                     "logprobs": chat_logprobs(handles[i], d.token_ids, d.logprobs),
                     "finish_reason": finish}
                if req.options.return_token_ids:
                    c["token_ids"] = d.token_ids
                yield chunk([c])

        final = (lambda: chunk([], usage=usage(handles, req.sampling.n))) \
            if req.options.include_usage else None
        return await stream_events(request, chunks, first, final)

    return await serve_handles(request, handles, respond)
