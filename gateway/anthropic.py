"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the chat path.

The request is parsed into chat messages (gateway.anthropic_schema), rendered and tokenized as
/v1/chat/completions renders them (tools in the generic format of gateway.tools), served by the
same handles, and the output is shaped into content blocks: text, and tool_use for each call
gateway.tool_parser finds. Streaming sends Anthropic's events:

    message_start, ping,
    (content_block_start, content_block_delta*, content_block_stop)*   text_delta | input_json_delta
    message_delta (stop_reason, stop_sequence, usage.output_tokens), message_stop

A tool_use block's input streams in pieces (`input_json_delta` events whose `partial_json` add up
to the input's JSON) for the parsers that stream arguments (gateway/tool_parser.py lists them);
for the others it comes in one `input_json_delta`. A block begun whose call then breaks off (the
output cut inside its input) ends with the pieces sent, a JSON prefix (gateway.tool_parser's
StreamShaper says why it cannot be taken back).

and an `error` event if the request fails after the first byte. Errors are Anthropic's shape,
{"type": "error", "error": {"type", "message"}} (gateway.app uses `anthropic_error` for every
error on these paths, the middleware's own included).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os

from aiohttp import web

from gateway.anthropic_schema import (
    MessagesRequest,
    _text_of,
    parse_conversation,
    parse_count_request,
    parse_messages_request,
)
from gateway.app_keys import GATEWAY_KEY
from gateway.chat_render import chat_prompt_ids
from gateway.errors import APIError, internal_error
from gateway.openai_schema import ChatMessage
from gateway.routes import check_model, merged, serve_handles, start_sse, submit_all
from gateway.sessions import PIN_STATUS_NAMES, anthropic_options
from gateway.structured import check_structured
from gateway.tool_parser import (
    ArgsPiece,
    CallStart,
    ToolCall,
    make_parser,
    sampling_for_parser,
    whole_items,
)
from gateway.tools import with_parser
from gateway.validation import parse_json_body

log = logging.getLogger("tidegate.gateway.anthropic")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error(err: APIError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"),
                                       "message": err.message}}


def sse_event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def _render_cut(gw, cut: dict, tools) -> list[int]:
    """A Messages body cut at a cache_control breakpoint, rendered as the prompt is (no
    generation prompt): its tokens are the prompt's first ones."""
    msgs = parse_conversation(cut)[0] if cut.get("messages") else \
        [ChatMessage("system", _text_of(cut["system"], "system"))] if cut.get("system") else []
    # rendered as _prompt_ids renders the prompt, so its tokens are the prompt's first ones
    return await chat_prompt_ids(gw, msgs, with_parser(tools, gw.config.tool_call_parser,
                                                       gw.info.chat_template),
                                 False, False)


async def _prompt_ids(gw, messages, prefill: str, tools) -> list[int]:
    return await chat_prompt_ids(gw, messages, with_parser(tools, gw.config.tool_call_parser,
                                                           gw.info.chat_template),
                                 True, False, prefill)


def _stop(asm, stop: tuple[str, ...]) -> str | None:
    """The stop sequence that ended the output (kept at its end by include_stop_str_in_output)."""
    if not asm.stopped_by_string:
        return None
    return next((s for s in sorted(stop, key=len, reverse=True) if asm.text.endswith(s)), None)


def _stop_reason(finish: str | None, stop_seq: str | None, num_calls: int) -> str:
    if stop_seq is not None:
        return "stop_sequence"
    if finish == "length":
        return "max_tokens"
    return "tool_use" if num_calls else "end_turn"


class BlockWriter:
    """Text deltas and tool calls -> content blocks (or their stream events). `streaming`: a
    call's input is sent as it is written; else only whole calls make blocks (a block that
    turns out to be no call is text, as the model wrote it)."""

    def __init__(self, tools, streaming: bool = False) -> None:
        self.parser = make_parser(tools, "toolu_") if tools is not None and tools.active \
            else None
        self.streaming = streaming
        self.blocks: list[dict] = []
        self._open_text = False
        self._open_tool: int | None = None  # the tool_use block whose input is streaming
        self._held = ""  # whitespace that may only separate calls

    def feed(self, text: str, final: bool) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if self.parser is None:
            items: list = [text]
        else:  # content and calls in the output's order
            items = self.parser.feed_items(text)
            if final:
                items += self.parser.finish_items()
            if not self.streaming:
                items = whole_items(items)
        for item in items:
            if isinstance(item, str):
                events += self._text(item) if item else []
            elif isinstance(item, CallStart) or isinstance(item, ToolCall) and not (
                    item.streamed and self.streaming):
                events += self._close()
                self.blocks.append({"type": "tool_use", "id": item.id, "name": item.name,
                                    "input": {}})
                self._open_tool = len(self.blocks) - 1
                events.append(("content_block_start", {
                    "type": "content_block_start", "index": self._open_tool,
                    "content_block": {"type": "tool_use", "id": item.id, "name": item.name,
                                      "input": {}}}))
                if isinstance(item, ToolCall):  # whole: its input in one piece, and done
                    self.blocks[-1]["input"] = item.arguments
                    events += self._input(item.arguments_text) + self._close()
            elif isinstance(item, ArgsPiece):
                events += self._input(item.text)
            elif isinstance(item, ToolCall):  # a streamed call read whole: its block's input
                # (a block of several calls, granite's, ends them all after the last began)
                next(b for b in reversed(self.blocks) if b.get("id") == item.id)["input"] = \
                    item.arguments
                if self._open_tool is not None and self.blocks[self._open_tool]["id"] == item.id:
                    events += self._close()
            else:  # BrokenCall: the call begun ends with what was sent (its input stays {})
                events += self._close()
        if final:
            events += self._close()
        return events

    def _input(self, piece: str) -> list[tuple[str, dict]]:
        return [("content_block_delta", {
            "type": "content_block_delta", "index": self._open_tool,
            "delta": {"type": "input_json_delta", "partial_json": piece}})]

    def _text(self, piece: str) -> list[tuple[str, dict]]:
        if self.parser is not None and not self._open_text and not (self._held + piece).strip():
            self._held += piece  # only whitespace so far: shown if text follows, not if a call
            return []
        piece, self._held = self._held + piece, ""
        # (a tool_use block still open ends here: every parser gives a call's end before the
        # text after it, but the block must stop before a text block starts whatever comes)
        events = self._close() if self._open_tool is not None else []
        if not self._open_text:
            self._open_text = True
            self.blocks.append({"type": "text", "text": ""})
            events.append(("content_block_start", {
                "type": "content_block_start", "index": len(self.blocks) - 1,
                "content_block": {"type": "text", "text": ""}}))
        self.blocks[-1]["text"] += piece
        events.append(("content_block_delta", {"type": "content_block_delta",
                                               "index": len(self.blocks) - 1,
                                               "delta": {"type": "text_delta", "text": piece}}))
        return events

    def _close(self) -> list[tuple[str, dict]]:
        """The open block's stop: the text block's, or the tool_use block's."""
        self._held = ""
        if self._open_tool is not None:
            index, self._open_tool = self._open_tool, None
            return [("content_block_stop", {"type": "content_block_stop", "index": index})]
        if not self._open_text:
            return []
        self._open_text = False
        return [("content_block_stop", {"type": "content_block_stop",
                                        "index": len(self.blocks) - 1})]

    @property
    def num_calls(self) -> int:
        return sum(b["type"] == "tool_use" for b in self.blocks)


async def messages(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY_KEY]
    body = parse_json_body(await request.read())
    req: MessagesRequest = parse_messages_request(body, gw.config.limits)
    gw.check_admission()
    check_model(gw, req.model)
    await check_structured(gw, req.structured)
    tools = req.structured.tools if req.structured is not None else None
    tools = with_parser(tools, gw.config.tool_call_parser, gw.info.chat_template)
    prompt_ids = await _prompt_ids(gw, req.messages, req.prefill, tools)
    msg_id = "msg_" + os.urandom(12).hex()
    # the session key, and a pin up to the deepest cache_control breakpoint (gateway.sessions)
    options = await anthropic_options(req.options, request.headers, body, prompt_ids,
                                      lambda cut: _render_cut(gw, cut, tools))
    handles = submit_all(gw, gw.new_request_id("msg"), [prompt_ids],
                         sampling_for_parser(tools, req.sampling), options,
                         "max_tokens")
    handle, model, stop = handles[0], gw.model_name, req.sampling.stop

    def usage(output_tokens: int) -> dict:
        # Anthropic's cache counts: the prompt tokens the prefix cache served, and those a pin
        # now holds that were computed for this request; `pin` says what became of a pin
        read = handle.cached_tokens
        pinned = handle.pin_status == 1
        pin_tokens = (options.pin_tokens or len(handle.prompt_ids)) if pinned else 0
        created = max(0, pin_tokens - read)
        out = {"input_tokens": len(handle.prompt_ids) - read - created,
               "output_tokens": output_tokens, "cache_creation_input_tokens": created,
               "cache_read_input_tokens": read}
        if options.pin_ttl_s and (handle.pin_status or output_tokens):
            # a backend that said nothing of the pin (an HTTP server) kept none
            out["pin"] = PIN_STATUS_NAMES.get(handle.pin_status, "unsupported")
        return out

    async def respond():
        writer = BlockWriter(tools, streaming=req.options.stream)
        if not req.options.stream:
            async for _ in merged(handles, 1 << 30):
                pass
            asm = handle.assembler
            seq = _stop(asm, stop)
            writer.feed(asm.text[:len(asm.text) - len(seq)] if seq else asm.text, True)
            return web.json_response({
                "id": msg_id, "type": "message", "role": "assistant", "model": model,
                "content": writer.blocks,
                "stop_reason": _stop_reason(asm.finish_reason, seq, writer.num_calls),
                "stop_sequence": seq, "usage": usage(len(asm.token_ids))}), 200
        return await _stream(request, handles, writer, msg_id, model, stop, usage)

    return await serve_handles(request, handles, respond)


async def _stream(request, handles, writer: BlockWriter, msg_id, model, stop, usage):
    resp = await start_sse(request)
    handle = handles[0]
    try:
        await resp.write(sse_event("message_start", {"type": "message_start", "message": {
            "id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage(0)}}))
        await resp.write(sse_event("ping", {"type": "ping"}))
        async for _, d in merged(handles, request.app[GATEWAY_KEY].config.stream_interval):
            text, seq = d.text, None
            if d.finish_reason is not None:
                seq = _stop(handle.assembler, stop)
                if seq and text.endswith(seq):
                    text = text[:len(text) - len(seq)]
            for name, data in writer.feed(text, d.finish_reason is not None):
                await resp.write(sse_event(name, data))
        asm = handle.assembler
        seq = _stop(asm, stop)
        await resp.write(sse_event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(asm.finish_reason, seq, writer.num_calls),
                      "stop_sequence": seq},
            "usage": {"output_tokens": len(asm.token_ids)}}))
        await resp.write(sse_event("message_stop", {"type": "message_stop"}))
        status = 200
    except APIError as err:
        await resp.write(sse_event("error", anthropic_error(err)))
        status = err.status
    except ConnectionResetError:
        return resp, 499
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug must still end the stream in Anthropic's shape
        log.exception("messages stream failed")
        err = internal_error()
        await resp.write(sse_event("error", anthropic_error(err)))
        status = err.status
    await resp.write_eof()
    return resp, status


async def count_tokens(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    model, msgs, prefill, tools = parse_count_request(parse_json_body(await request.read()))
    check_model(gw, model)
    ids = await _prompt_ids(gw, msgs, prefill, tools)
    return web.json_response({"input_tokens": len(ids)})
